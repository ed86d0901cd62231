"""`roofline predict`: predict each configuration of a CSV and compare with measured values.

Input columns: ``id, framework, hardware, n_gpus, model, weight_format,
kv_format, batch, input_len, output_len, metric`` and optionally ``value,
unit``, ``attention`` (fused, the default, or unfused) and ``context_depth``
(tokens already in the KV cache when a prompt is measured, as llama-bench's
``ppN @ dM``); other columns are ignored. The ``framework`` picks the engine profile (``engines_db/``). A row whose names do not resolve gets a
status and a reason, and the other rows still run. Names with a parenthetical
remark (``FP8 (ModelOpt)``) are tried with and without it.

A row without a batch (an offline max-throughput benchmark that queues every
request at once) is evaluated at the largest batch whose KV cache fits at that
context, and its reason says so.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from estimator.efficiency.defaults import EngineDefaults
from estimator.efficiency.engine_profiles import EngineProfile, engine, engine_for_framework
from estimator.errors import ConfigurationError, RooflineError, UnknownNameError
from estimator.evaluation.api import Configuration, resolve_model, results_for_configurations
from estimator.serving.workload import Layout, ServingOptions, check_layout
from estimator.specs.database import Database, load_database
from estimator.specs.formats import kv_format, weight_format

# metric name -> (result column, factor from base units to the metric's unit)
METRICS = {
    "decode_tps_per_seq": ("decode_tps_per_seq", 1.0),
    "decode_tps_total": ("decode_tps_total", 1.0),
    "prefill_tps": ("prefill_tps", 1.0),
    "ttft_ms": ("ttft_s", 1e3),
    "itl_ms": ("itl_s", 1e3),
    "throughput_out_tps": ("throughput_out_tps", 1.0),
    "throughput_out_tps_per_gpu": ("throughput_out_tps_per_gpu", 1.0),
    "e2e_latency_s": ("e2e_latency_s", 1.0),
}
REQUIRED = ("id", "hardware", "n_gpus", "model", "weight_format", "batch", "input_len", "output_len", "metric")
OUTPUT_COLUMNS = ("id", "status", "engine", "metric", "predicted", "measured", "unit", "rel_error", "reason")


def _candidates(name: str) -> list[str]:
    """The name as written, then without a trailing remark in parentheses or after a comma."""
    stripped = re.sub(r"\s*\(.*\)\s*$", "", name).strip()
    return list(dict.fromkeys([name.strip(), stripped, stripped.split(",")[0].strip()]))


def _resolve(lookup, name: str):
    error = None
    for candidate in _candidates(name):
        try:
            return lookup(candidate)
        except UnknownNameError as exc:
            error = error or exc
    raise error


def _int(row: dict, key: str, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is None:
            raise ConfigurationError(f"column {key!r} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"column {key!r} is not a number: {text!r}") from None
    if not value.is_integer():
        raise ConfigurationError(f"column {key!r} must be a whole number, got {text!r}")
    return int(value)


def configuration_from_row(row: dict, db: Database, engine: EngineProfile | None = None) -> Configuration:
    """Resolve one CSV row; raises a RooflineError that says what is wrong.

    Several devices split the model the way the row's engine does: tensor
    parallelism, or layers (a pipeline) for llama.cpp and ExLlamaV2.
    """
    metric = row.get("metric", "").strip()
    if metric not in METRICS:
        raise ConfigurationError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    model = _resolve(lambda n: resolve_model(n, db), row["model"])
    devices = _int(row, "n_gpus", 1)
    by_layers = engine is not None and engine.multi_gpu == "layers"
    layout = Layout(tp=1, pp=devices) if by_layers else Layout.from_devices(devices=devices)
    check_layout(model, layout)
    return Configuration(
        model=model,
        hardware=_resolve(db.hardware.get, row["hardware"]),
        weight_format=_resolve(weight_format, row["weight_format"]),
        kv_format=_resolve(kv_format, row.get("kv_format") or "f16"),
        layout=layout, batch=_int(row, "batch", 1),  # empty batch: saturated below
        # a generation benchmark from an empty context (llama-bench tgN) starts from one BOS token
        prompt_tokens=max(_int(row, "input_len", 0), 1), output_tokens=max(_int(row, "output_len", 1), 1))


def _status(exc: RooflineError) -> str:
    text = str(exc)
    for kind in ("model", "gpu", "weight format", "KV-cache format"):
        if text.startswith(f"unknown {kind}"):
            return "unknown_" + kind.split()[0].lower().replace("-cache", "").replace("gpu", "hardware")
    return "invalid"


@dataclass
class Resolved:
    """Rows that resolved, with their configurations and engines, ready to evaluate many times."""

    positions: list[int]          # index of each resolved row in the input
    configs: list[Configuration]
    engines: list[str]            # engine profile name per resolved row
    saturate: list[bool]          # no batch given: evaluate at the largest batch that fits
    metrics: list[str]
    attention: list[str] = field(default_factory=list)   # fused | unfused, per row
    depth: list[int] = field(default_factory=list)       # tokens already cached before a measured prompt


def resolve_rows(rows: list[dict], db: Database) -> tuple[Resolved, list[dict]]:
    """Resolve every row once; the second value is one result dict per input row (errors filled in)."""
    out = []
    resolved = Resolved([], [], [], [], [], [], [])
    for i, row in enumerate(rows):
        result = {"id": row.get("id", ""), "metric": row.get("metric", ""), "measured": row.get("value", ""),
                  "unit": row.get("unit", ""), "predicted": "", "rel_error": "", "status": "ok", "reason": "",
                  "engine": ""}
        try:
            profile = engine_for_framework(row.get("framework", ""))
            config = configuration_from_row(row, db, profile)
            depth = _int(row, "context_depth", 0)
            if depth:   # a prompt measured on top of `depth` cached tokens (llama-bench ppN @ dM)
                config = replace(config, prompt_tokens=config.prompt_tokens + depth)
        except (RooflineError, KeyError) as exc:
            result["status"] = _status(exc) if isinstance(exc, RooflineError) else "invalid"
            result["reason"] = str(exc) if isinstance(exc, RooflineError) else f"missing column {exc}"
        else:
            result["engine"] = profile.name
            resolved.positions.append(i)
            resolved.configs.append(config)
            resolved.engines.append(profile.name)
            resolved.saturate.append(not (row.get("batch") or "").strip())
            resolved.metrics.append(row["metric"].strip())
            resolved.attention.append(_attention(row))
            resolved.depth.append(_int(row, "context_depth", 0))
        out.append(result)
    return resolved, out


def predict_resolved(resolved: Resolved, parameters: dict[str, EngineDefaults] | None = None) -> list[dict]:
    """Results per resolved row, each engine's rows with its parameters (overridable, for fitting)."""
    results: list[dict] = [{} for _ in resolved.configs]
    keys = list(zip(resolved.engines, resolved.attention, resolved.depth))
    for name, attention, depth in sorted(set(keys)):
        idx = [i for i, key in enumerate(keys) if key == (name, attention, depth)]
        profile = engine(name)
        if parameters and name in parameters:
            profile = profile.model_copy(update={"parameters": parameters[name]})
        serving = ServingOptions(attention=attention, prefix_tokens=depth)
        configs = [resolved.configs[i] for i in idx]
        columns = results_for_configurations(configs, serving=serving, engine=profile)
        saturate = [j for j, i in enumerate(idx) if resolved.saturate[i]]
        if saturate:
            for j in saturate:
                configs[j] = replace(configs[j], batch=int(max(columns["max_batch"][j], 1)))
            columns = results_for_configurations(configs, serving=serving, engine=profile)
        for j, i in enumerate(idx):
            results[i] = {k: v[j] for k, v in columns.items()}
            results[i]["batch_used"] = configs[j].batch
    return results


def _attention(row: dict) -> str:
    """The optional ``attention`` column: fused (FlashAttention-style, the default) or unfused."""
    value = (row.get("attention") or "fused").strip().lower()
    if value not in ("fused", "unfused"):
        raise ConfigurationError(f"column 'attention' must be fused or unfused, got {value!r}")
    return value


def predicted_values(resolved: Resolved, results: list[dict]):
    """Each resolved row's prediction in its metric's unit."""
    import numpy as np
    return np.array([float(r[METRICS[m][0]]) * METRICS[m][1] for r, m in zip(results, resolved.metrics)])


def predict_rows(rows: list[dict], db: Database | None = None) -> list[dict]:
    """Predicted (and, where given, measured and relative error) for each input row."""
    db = db or load_database()
    resolved, out = resolve_rows(rows, db)
    if resolved.configs:
        for j, result in enumerate(predict_resolved(resolved)):
            i = resolved.positions[j]
            _fill(out[i], result, resolved.configs[j])
            if resolved.saturate[j]:
                out[i]["reason"] = (out[i]["reason"] + "; " if out[i]["reason"] else "") + \
                    f"batch not given: evaluated at the largest batch that fits, {result['batch_used']}"
    return out


def _fill(result: dict, r: dict, config: Configuration) -> None:
    column, factor = METRICS[result["metric"]]
    predicted = float(r[column]) * factor
    result["predicted"] = f"{predicted:.6g}"
    if not r["fits"]:
        result["status"] = "does_not_fit"
        result["reason"] = (f"needs {r['memory_required_bytes'] / 1e9:.1f} GB per device, has "
                            f"{r['memory_available_bytes'] / 1e9:.1f} GB; prediction assumes it fits")
    measured = result["measured"].strip() if isinstance(result["measured"], str) else result["measured"]
    if measured not in ("", None):
        value = float(measured)
        if value > 0 and math.isfinite(value):
            result["rel_error"] = f"{predicted / value - 1:+.4f}"


def predict_file(in_path: str, out_path: str, db: Database | None = None, force: bool = False) -> str:
    """Read ``in_path``, write ``out_path`` (never over an existing file unless ``force``), return a summary."""
    src, dst = Path(in_path), Path(out_path)
    if dst.exists() and not force:
        raise ConfigurationError(f"{dst} exists; pass --force to overwrite it, or choose another --out")
    try:
        with src.open(newline="") as fh:
            reader = csv.DictReader(fh)
            missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
            if missing:
                raise ConfigurationError(f"{src}: missing columns {missing}; required: {', '.join(REQUIRED)}")
            rows = list(reader)
    except OSError as exc:
        raise ConfigurationError(f"cannot read {src}: {exc.strerror}") from None
    results = predict_rows(rows, db)
    with dst.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=OUTPUT_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(results)
    return summarize(results, dst)


def summarize(results: list[dict], dst: Path) -> str:
    errors = sorted(abs(float(r["rel_error"])) for r in results if r["rel_error"] != "")
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r["status"]] = by_status.get(r["status"], 0) + 1
    lines = [f"wrote {len(results)} rows to {dst}: " + ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))]
    if errors:
        median = errors[len(errors) // 2]
        p90 = errors[min(len(errors) - 1, int(0.9 * len(errors)))]
        lines.append(f"{len(errors)} rows with a measured value: median |error| {median:.1%}, "
                     f"90th percentile {p90:.1%} (each row with its engine's profile)")
    return "\n".join(lines)
