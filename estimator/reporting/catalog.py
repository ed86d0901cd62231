"""`roofline list` and `roofline show`: the databases as tables and as sourced field lists."""

from __future__ import annotations

from typing import Iterator

from pydantic import BaseModel

from estimator.errors import UnknownNameError
from estimator.evaluation.columns import model_columns
from estimator.formatting import table, to_json
from estimator.physics.params import count_params
from estimator.physics.traffic import kv_bytes_per_token as kv_bytes_per_token_columns
from estimator.reporting.estimate_text import format_quantity, format_spec
from estimator.specs.database import Database
from estimator.specs.formats import KV_FORMATS, WEIGHT_FORMATS
from estimator.specs.hardware import Hardware, MemoryOptions, Price
from estimator.specs.model import ModelSpec
from estimator.specs.sourced import Quantity
from estimator.units import TB, TFLOPS, GiB, KiB

KV_BYTES_BF16 = 2


def _peak(hw: Hardware, dtype: str) -> str:
    peak = hw.peak_flops_per_s(dtype)
    return "-" if peak is None else f"{peak / TFLOPS:,.0f}"


def gpu_summary(hw: Hardware) -> dict:
    return {
        "name": hw.name, "vendor": hw.vendor, "class": hw.device_class.value,
        "memory_gib": hw.memory_capacity_bytes / GiB, "memory_type": hw.memory.type.value,
        "bandwidth_tb_per_s": hw.memory_bandwidth_bytes_per_s / TB,
        "dense_tflops": {k: v.base / TFLOPS for k, v in hw.dense_peak.items()},
        "tdp_w": hw.tdp.value, "aliases": hw.aliases,
    }


def kv_bytes_per_token(spec: ModelSpec, kv_bits: float = 16) -> float:
    """KV-cache bytes per token of context at full length (sliding-window layers counted in full; layers that
    hold no cache of their own, linear-attention or KV-sharing ones, not at all)."""
    return float(kv_bytes_per_token_columns(model_columns([spec]), kv_bits)[0])


def attention_kind(spec: ModelSpec) -> str:
    s = spec.shape
    if s.mla:
        kind = "MLA"
    elif s.num_kv_heads == 1:
        kind = "MQA"
    elif s.num_kv_heads < s.num_attention_heads:
        kind = f"GQA-{s.num_attention_heads // s.num_kv_heads}"
    else:
        kind = "MHA"
    if s.num_local_layers:
        kind += f" +SWA {s.sliding_window} ({s.num_local_layers}/{s.num_layers})"
    if s.sparse_attention:
        kind += f" +DSA top-{s.sparse_attention.index_topk}"
    if s.linear_attention:
        kind += f" +GDN ({s.num_linear_layers}/{s.num_layers})"
    if s.num_kv_shared_layers:
        kind += f" +KV shared ({s.num_kv_shared_layers}/{s.num_layers})"
    return kind


def model_summary(spec: ModelSpec) -> dict:
    counts = count_params(spec)
    return {
        "name": spec.name, "hf_id": spec.hf_id, "family": spec.family,
        "params_total_b": counts.total / 1e9, "params_active_b": counts.active / 1e9,
        "moe": spec.shape.moe is not None, "layers": spec.shape.num_layers, "hidden": spec.shape.hidden_size,
        "attention": attention_kind(spec), "max_context": spec.shape.max_context,
        "kv_kib_per_token_bf16": kv_bytes_per_token(spec) / KiB, "aliases": spec.aliases,
    }


def _gpu_selected(hw: Hardware, args) -> bool:
    return ((args.vendor is None or hw.vendor.lower() == args.vendor.lower())
            and (args.device_class is None or hw.device_class.value == args.device_class)
            and (args.min_memory_gib is None or hw.memory_capacity_bytes >= args.min_memory_gib * GiB))


def _model_selected(spec: ModelSpec, args) -> bool:
    return ((args.family is None or spec.family.lower() == args.family.lower())
            and (not args.moe or spec.shape.moe is not None))


def _check_known(flag: str, value: str | None, known) -> None:
    """A filter value that matches no entry is a typo, not an empty list: say which values exist."""
    known = sorted(set(known), key=str.lower)
    if value is not None and value.lower() not in {k.lower() for k in known}:
        raise UnknownNameError(f"{flag} {value!r} matches no entry; use one of: {', '.join(known)}")


def list_entries(db: Database, args) -> str:
    """Text table (or JSON) of gpus, models or formats, filtered by the CLI's options."""
    _check_known("--vendor", args.vendor, (hw.vendor for hw in db.hardware))
    _check_known("--family", args.family, (spec.family for spec in db.models))
    if args.what == "gpus":
        rows = [gpu_summary(hw) for hw in sorted(db.hardware, key=lambda h: (h.vendor, h.name)) if _gpu_selected(hw, args)]
        if args.json:
            return to_json(rows)
        return table([(r["name"], r["vendor"], r["class"], f"{r['memory_gib']:.0f}", r["memory_type"],
                       f"{r['bandwidth_tb_per_s']:.3f}", _peak(db.hardware.get(r["name"]), "bf16")
                       if "bf16" in r["dense_tflops"] else _peak(db.hardware.get(r["name"]), "fp16"),
                       _peak(db.hardware.get(r["name"]), "fp8"), _peak(db.hardware.get(r["name"]), "fp4"))
                      for r in rows],
                     header=("name", "vendor", "class", "GiB", "memory", "TB/s", "16-bit TFLOPS", "fp8", "fp4"))
    if args.what == "models":
        rows = [model_summary(s) for s in sorted(db.models, key=lambda s: (s.family, s.name)) if _model_selected(s, args)]
        if args.json:
            return to_json(rows)
        return table([(r["name"], r["hf_id"], f"{r['params_total_b']:.2f}", f"{r['params_active_b']:.2f}",
                       r["attention"], f"{r['max_context']:,}", f"{r['kv_kib_per_token_bf16']:.1f}") for r in rows],
                     header=("name", "hf_id", "total B", "active B", "attention", "context", "KV KiB/token"))
    weights = [{"kind": "weight", "name": f.name, "bits": f.linear_bits, "head_bits": f.head_bits,
                "compute": "/".join(f.compute_dtypes), "basis": f.basis} for f in WEIGHT_FORMATS]
    kvs = [{"kind": "kv", "name": f.name, "bits": f.bits, "basis": f.basis} for f in KV_FORMATS]
    if args.json:
        return to_json(weights + kvs)
    return "\n\n".join([
        "Weight formats (bits per weight include scales and zero points)",
        table([(w["name"], f"{w['bits']:.3f}", f"{w['head_bits']:g}", w["compute"], w["basis"]) for w in weights],
              header=("name", "bits", "head bits", "compute (first available)", "basis")),
        "KV-cache formats",
        table([(k["name"], f"{k['bits']:g}", k["basis"]) for k in kvs], header=("name", "bits", "basis")),
    ])


def _walk(obj: BaseModel, prefix: str = "") -> Iterator[tuple[str, str, str]]:
    """(field path, value, source) for every field, recursing into nested specs."""
    for name in type(obj).model_fields:
        value = getattr(obj, name)
        path = f"{prefix}{name}"
        if value is None:
            continue
        if isinstance(value, Price):
            yield path, f"{value.value:g} {value.unit} ({value.kind}, {value.date})", value.source
        elif isinstance(value, Quantity):
            source = value.source + (f" ({value.note})" if value.note else "")
            yield path, format_quantity(value), source
        elif isinstance(value, MemoryOptions):
            sizes = ", ".join(f"{v:g}" for v in value.value)
            yield path, f"{sizes} {value.unit}", value.source + (f" ({value.note})" if value.note else "")
        elif isinstance(value, BaseModel):
            yield from _walk(value, path + ".")
        elif isinstance(value, dict):
            for key, item in value.items():
                if isinstance(item, Quantity):
                    yield f"{path}.{key}", format_quantity(item), item.source + (f" ({item.note})" if item.note else "")
        elif isinstance(value, (list, tuple)):
            if name != "aliases":
                yield path, ", ".join(str(getattr(v, "value", v)) for v in value), ""
        elif name != "notes":
            yield path, str(getattr(value, "value", value)), ""


def show_entry(db: Database, what: str, name: str, as_json: bool = False) -> str:
    """Every field of one entry and where it comes from, plus the derived figures."""
    if what == "gpu":
        hw = db.hardware.get(name)
        if as_json:
            return to_json({**hw.model_dump(mode="json"), "origin": db.hardware.origins[hw.name]})
        derived = hw.memory.derived_bandwidth_bytes_per_s
        extra = [("ridge point (16-bit)", f"{hw.ridge_point_flops_per_byte:.0f} FLOP/byte", "derived: peak / bandwidth")]
        if derived:
            extra.append(("bus width x data rate", f"{derived / TB:.3f} TB/s", "derived: check against bandwidth"))
        if hw.fp32_lanes_per_sm is not None:
            extra.append(("FP32 lanes per SM", f"{hw.fp32_lanes_per_sm:.1f}",
                          "derived: FP32 peak / (2 x SMs x boost clock); 64 or 128 on NVIDIA parts"))
        return _with_notes(f"{hw.name}  ({db.hardware.origins[hw.name]})\n" + format_spec([*_walk(hw), *extra]), hw)
    spec = db.models.get(name)
    counts = count_params(spec)
    if as_json:
        return to_json({**spec.model_dump(mode="json"), **model_summary(spec),
                        "origin": db.models.origins[spec.name]})
    rows = [(k, v, s or (spec.config_source if k.startswith("shape.") else "")) for k, v, s in _walk(spec)]
    rows += [("params total (computed)", f"{counts.total / 1e9:.3f} B", "from shapes, estimator/physics/params.py"),
             ("params active (computed)", f"{counts.active / 1e9:.3f} B", "k routed experts; embedding included"),
             ("KV cache per token (bf16)", f"{kv_bytes_per_token(spec) / KiB:.1f} KiB", attention_kind(spec))]
    return _with_notes(f"{spec.name}  ({db.models.origins[spec.name]})\n" + format_spec(rows), spec)


def _with_notes(text: str, entry) -> str:
    lines = [text, "", "aliases: " + (", ".join(entry.aliases) or "none")]
    if entry.notes:
        lines.append("notes: " + entry.notes.strip())
    return "\n".join(lines)


def check_database(db: Database) -> str:
    """`roofline check`: every entry validated (on load), and computed vs published parameter counts."""
    rows = []
    for spec in sorted(db.models, key=lambda s: s.name):
        counts, pub = count_params(spec), spec.published_params
        total_err = "" if pub is None else \
            f"{counts.total_as_published(pub.total_includes_embeddings) / (pub.total_billion * 1e9) - 1:+.1%}"
        active_err = "" if pub is None or pub.active_billion is None else \
            f"{counts.active_as_published(pub.active_includes_embedding) / (pub.active_billion * 1e9) - 1:+.1%}"
        if not spec.published_params_checked:   # the shapes leave out parameters: shown, not checked
            total_err, active_err = (f"{e} (unchecked)" if e else "" for e in (total_err, active_err))
        rows.append((spec.name, f"{counts.total / 1e9:.2f}", total_err, f"{counts.active / 1e9:.2f}", active_err))
    lines = [f"{len(db.hardware)} hardware and {len(db.models)} model entries: all valid"]
    lines += [f"override: {line}" for line in db.overrides]
    unmodelled = sorted(spec.name for spec in db.models if not spec.published_params_checked)
    if unmodelled:
        lines.append(f"{len(unmodelled)} models use mechanisms the schema does not model ({', '.join(unmodelled)}): "
                     "estimating them is refused, and their computed counts are shown but not checked "
                     "against the published ones")
    lines += ["", table(rows, header=("model", "total B", "vs published", "active B", "vs published"))]
    return "\n".join(lines)
