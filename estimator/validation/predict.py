"""`roofline predict`: predict each configuration of a CSV and compare with measured values.

Columns are those of the measurement schema (``measurements_db/SCHEMA.md``). Required: ``id, hardware,
n_gpus, model, weight_format, batch, input_len, output_len, metric``; the others are optional: ``engine``
(else the ``framework`` text picks the profile in ``engines_db/``) with ``engine_version`` and ``runtime``
(TensorRT-LLM's ``pytorch`` or ``tensorrt``: the release's default when empty), the layout (``tp, pp, ep, dp,
attention_dp``), ``memory_gib``, ``kv_format``, ``attention``, ``context_depth``, ``gpu_layers``, ``cpu_moe``,
``calibration`` (the profile of the machine the row ran on: :mod:`estimator.validation.row_calibration`), and
for a serving benchmark ``concurrency`` or ``request_rate`` with ``max_num_seqs``, ``prefix_hit_rate``,
``num_requests`` and ``lengths`` (the dataset its requests came from, a preset, at the row's mean lengths;
or a CSV of the run's own requests, relative to the row's file).
Mean lengths may be fractional. A row that cannot be predicted gets a status and a reason, and the other
rows still run. Names with a parenthetical remark (``FP8 (ModelOpt)``) are tried with and without it.

A row without a batch and without a load is sent all at once when it gives ``num_requests``; else (an
offline max-throughput benchmark) it is evaluated at the largest batch the engine runs: what its KV cache
holds at that context, up to its ``max_num_seqs``, and its reason says so.
"""

from __future__ import annotations

import csv
import io
import math
import re
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from estimator.efficiency.calibration_profile import calibration_note
from estimator.efficiency.engine_profiles import EngineProfile, engine_of_measurement
from estimator.errors import (
    ConfigurationError,
    DatabaseError,
    RooflineError,
    UnknownNameError,
    describe_validation_error,
    prepare_output,
    read_text,
    write_atomically,
)
from estimator.evaluation.api import resolve_model
from estimator.evaluation.configurations import Configuration
from estimator.evaluation.intervals import (
    band_regime,
    default_backend,
    measurement_band,
    measurement_regime,
    row_interval,
)
from estimator.serving.lengths import file_beside, preset_at_means
from estimator.serving.workload import Layout, ServingOptions, check_layout, scale_up_domain
from estimator.specs.database import Database, load_database
from estimator.specs.formats import format_family, kv_format, weight_format
from estimator.validation.dataset import ENUMERATED_COLUMNS, enumerated_problem, unknown_columns
from estimator.validation.metrics import METRICS, NEEDS_LENGTHS, result_column
from estimator.validation.resolved import Resolved, predict_resolved
from estimator.validation.row_calibration import calibration_of_row

REQUIRED = ("id", "hardware", "n_gpus", "model", "weight_format", "batch", "input_len", "output_len", "metric")
OUTPUT_COLUMNS = ("id", "status", "engine", "metric", "predicted", "predicted_low", "predicted_high", "measured",
                  "unit", "rel_error", "reason")


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


def _cell(row: dict, key: str) -> str:
    """A cell as text; a short row's missing cells are empty."""
    value = row.get(key)
    return value.strip() if isinstance(value, str) else ""


def _number(row: dict, key: str, default: float | None = None, minimum: float = 0.0,
            maximum: float = math.inf) -> float:
    """A numeric cell in [``minimum``, ``maximum``]; ``default`` when empty (an error when there is none)."""
    text = _cell(row, key)
    if not text:
        if default is None:
            raise ConfigurationError(f"column {key!r} is empty")
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigurationError(f"column {key!r} is not a number: {text!r}") from None
    if not math.isfinite(value) or value < minimum or value > maximum:
        accepted = f">= {minimum:g}" if math.isinf(maximum) else f"from {minimum:g} to {maximum:g}"
        raise ConfigurationError(f"column {key!r} must be a finite number {accepted}, got {text!r}")
    return value


def _int(row: dict, key: str, default: int | None = None, minimum: int = 0) -> int:
    """A whole-number cell (``4`` or ``4.0``), at least ``minimum``."""
    value = _number(row, key, None if default is None else float(default), float(minimum))
    if not value.is_integer():
        raise ConfigurationError(f"column {key!r} must be a whole number >= {minimum}, got {_cell(row, key)!r}")
    return int(value)


def _positive_cell(row: dict, key: str, whole: bool = False) -> float:
    """A cell that sets a load, a cap or a count of devices or layers (``concurrency``, ``request_rate``,
    ``max_num_seqs``, ``num_requests``, ``tp``/``pp``/``ep``/``dp``, ``gpu_layers``): empty for none (0), else a finite
    number above 0, a whole one for a count. A written 0 is an error, not the absence of a setting: read as empty it
    would run the row another way (no load; the default layout; every layer on the device)."""
    if not _cell(row, key):
        return 0
    value = _int(row, key, minimum=1) if whole else _number(row, key)
    if value <= 0:
        raise ConfigurationError(f"column {key!r} must be a finite number > 0, got {_cell(row, key)!r}")
    return value


def hardware_of_row(row: dict, db: Database):
    """The row's device, resolved once (the engine's backend and the configuration both need it), with the
    row's ``memory_gib`` when it names one of the sizes the device is sold with (else its largest)."""
    if not _cell(row, "hardware"):
        raise ConfigurationError("column 'hardware' is empty")
    hardware = _resolve(db.hardware.get, _cell(row, "hardware"))
    if _cell(row, "memory_gib"):
        hardware = hardware.with_memory_gib(_number(row, "memory_gib", minimum=0.0))
    return hardware


def configuration_from_row(row: dict, db: Database, engine: EngineProfile | None = None,
                           hardware=None) -> Configuration:
    """Resolve one CSV row (``hardware`` when the caller resolved it already); raises a RooflineError that says
    what is wrong.

    Several devices split the model the way the row's engine does: tensor
    parallelism (``tp`` when the row gives it, all devices otherwise), or layers
    (a pipeline) for llama.cpp and ExLlamaV2.
    """
    metric = _cell(row, "metric")
    if metric not in METRICS:
        raise ConfigurationError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    for key in ("model", "weight_format"):
        if not _cell(row, key):
            raise ConfigurationError(f"column {key!r} is empty")
    for key in NEEDS_LENGTHS.get(metric, ()):
        if not _cell(row, key):
            raise ConfigurationError(f"column {key!r} is empty: a {metric} row needs the tokens per request "
                                     "(a dataset's mean may be fractional; 0 for none)")
    hardware = hardware or hardware_of_row(row, db)
    model = _resolve(lambda n: resolve_model(n, db), _cell(row, "model")).require_modelled()
    model = engine.runs_model(model) if engine else model
    fmt = _resolve(weight_format, _cell(row, "weight_format"))
    layout = layout_of_row(row, model, hardware, engine)
    check_layout(model, layout)
    return Configuration(
        calibration=calibration_of_row(row),
        model=model, hardware=hardware, weight_format=engine.runs(fmt) if engine else fmt,
        kv_format=_resolve(kv_format, _cell(row, "kv_format") or "f16"),
        layout=layout, batch=_int(row, "batch", 1, minimum=1),  # no batch: saturated or under load below
        # a generation benchmark from an empty context (llama-bench tgN) starts from one BOS token
        # the mean lengths of a benchmark dataset may be fractional
        prompt_tokens=max(_number(row, "input_len", 0.0), 1.0), output_tokens=max(_number(row, "output_len", 1.0), 1.0))


def layout_of_row(row: dict, model, hardware, engine: EngineProfile | None = None) -> Layout:
    """The row's layout: its ``tp``, ``pp``, ``ep`` and ``dp`` columns, the rest filled in as the engine splits
    a model (:meth:`Layout.from_devices`: TP within the device's scale-up domain, replicas across domains;
    llama.cpp and ExLlamaV2 split layers, a pipeline)."""
    devices = _int(row, "n_gpus", 1, minimum=1)
    tp, pp, ep, dp = (_positive_cell(row, key, whole=True) or None for key in ("tp", "pp", "ep", "dp"))
    if engine is not None and engine.multi_gpu == "layers" and tp is None and pp is None:
        tp, pp = 1, devices // (dp or 1)
    layout = Layout.from_devices(devices=devices, tp=tp, pp=pp or 1, ep=ep or 1, model=model,
                                 devices_per_node=scale_up_domain(hardware), attention_dp=_flag(row, "attention_dp"))
    if dp is not None and layout.dp != dp:
        raise ConfigurationError(f"n_gpus {devices} with tp={layout.tp} and pp={layout.pp} makes {layout.dp} "
                                 f"replicas, not the row's dp={dp}; n_gpus must be tp x pp x dp")
    return layout


def serving_from_row(row: dict) -> ServingOptions:
    """The row's serving conditions: attention kind, cached context, partial offload, and load."""
    depth = _int(row, "context_depth", 0)
    sent = 0 if _cell(row, "batch") else _positive_cell(row, "num_requests", whole=True)
    options = dict(attention=_attention(row), prefix_tokens=depth,
                   gpu_layers=_positive_cell(row, "gpu_layers", whole=True) or None,
                   concurrency=_positive_cell(row, "concurrency", whole=True),
                   rate=float(_positive_cell(row, "request_rate")),
                   prefix_hit_rate=_number(row, "prefix_hit_rate", 0.0, maximum=1.0),
                   # a finite run at a rate or through a concurrency's clients, or (no load, no batch) sent at once
                   num_requests=sent,
                   # MoE layers whose experts are in host memory (llama.cpp --n-cpu-moe; docs/formulas.md §8)
                   cpu_moe=_int(row, "cpu_moe", 0))
    lengths = _cell(row, "lengths")
    if lengths.endswith(".csv"):   # the run's own requests, relative to the folder of the CSV that holds the row
        options["lengths"] = file_beside(lengths, row.get("folder") or ".")
        if not Path(options["lengths"]).is_file():
            raise ConfigurationError(f"column 'lengths': no file {lengths!r} beside the CSV that holds the row "
                                     "(a CSV of prompt,output per request, or a length preset)")
    elif lengths:   # the dataset the requests came from (a preset), at the row's mean lengths
        options["lengths"] = preset_at_means(lengths, _number(row, "input_len", 1.0, minimum=1.0),
                                             _number(row, "output_len", 1.0, minimum=1.0))
    if options["cpu_moe"] and _cell(row, "n_ubatch"):   # experts cross the host link once per micro-batch
        options["ubatch_tokens"] = _int(row, "n_ubatch", minimum=1)
    if options["concurrency"] and options["rate"]:
        raise ConfigurationError("a row gives its load as 'concurrency' or 'request_rate', not both")
    try:
        return ServingOptions(**options)
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc)) from None


def engine_of_row(row: dict, hardware) -> EngineProfile:
    """The profile the row's ``engine`` column names (an unknown name is the row's error, not the generic
    engine), else, when it is empty or ``other``, the one its ``framework`` text names; on the row's
    ``backend`` (or the device's usual one): llama.cpp on ROCm is ``llama.cpp@rocm``."""
    profile = engine_of_measurement(_cell(row, "engine"), _cell(row, "framework"))
    backend = _cell(row, "backend") or default_backend(hardware.vendor, hardware.device_class.value)
    return profile.on_backend(backend)


def _status(exc: RooflineError) -> str:
    text = str(exc)
    for kind in ("model", "gpu", "weight format", "KV-cache format", "engine"):
        if text.startswith(f"unknown {kind}"):
            return "unknown_" + kind.split()[0].lower().replace("-cache", "").replace("gpu", "hardware")
    return "not_modelled" if "not modelled" in text else "invalid"


def resolve_rows(rows: list[dict], db: Database) -> tuple[Resolved, list[dict]]:
    """Resolve every row once; the second value is one result dict per input row (errors filled in)."""
    out = []
    resolved = Resolved()
    for i, row in enumerate(rows):
        result = {"id": _cell(row, "id"), "metric": _cell(row, "metric"), "measured": _cell(row, "value"),
                  "unit": _cell(row, "unit"), "predicted": "", "rel_error": "", "status": "ok", "reason": "",
                  "engine": ""}
        try:
            if result["measured"]:
                _number(row, "value", minimum=0.0)
            if problem := enumerated_problem({k: _cell(row, k) for k, _ in ENUMERATED_COLUMNS}):
                raise ConfigurationError(f"column {problem}")
            hardware = hardware_of_row(row, db)
            profile = engine_of_row(row, hardware)
            run = (_cell(row, "engine_version"), _cell(row, "runtime"))
            scheduling = profile.scheduling_at(*run)
            config = configuration_from_row(row, db, profile, hardware)
            serving = serving_from_row(row)
            # the engine's cap on running sequences: the row's, else its release's default for this device
            scheduler = profile.scheduler_at(*run)
            cap = float(_positive_cell(row, "max_num_seqs", whole=True) or
                        (scheduler.max_num_seqs_on(hardware) if scheduler else math.inf))
            if serving.engine_sets_batch and math.isfinite(cap):
                serving = serving.model_copy(update={"max_num_seqs": int(cap)})
            if serving.prefix_tokens:   # a prompt measured on top of cached tokens (llama-bench ppN @ dM)
                config = replace(config, prompt_tokens=config.prompt_tokens + serving.prefix_tokens)
            serving.check([config.prompt_tokens], [config.model], [config.layout])
        except DatabaseError:
            raise   # a broken database is not a problem of this row
        except RooflineError as exc:
            result["status"], result["reason"] = _status(exc), str(exc)
        else:
            result["engine"] = profile.name
            if config.layout.dp > 1 and not (_cell(row, "tp") or _cell(row, "dp")):
                result["reason"] = f"layout chosen: {config.layout.label} (TP within a scale-up domain, replicas " \
                                   "across; give tp/pp/ep/dp columns to set it)"
            resolved.positions.append(i)
            resolved.configs.append(config)
            resolved.engines.append(profile.name)
            resolved.serving.append(serving)
            resolved.saturate.append(not _cell(row, "batch") and not serving.under_load)
            # requests sent at once
            at_once = _positive_cell(row, "num_requests", whole=True) if not serving.under_load else 0
            resolved.batch_caps.append(min(cap, at_once or math.inf))
            resolved.profiled_sequences.append(cap)
            resolved.requests_at_once.append(float(at_once))
            resolved.scheduling.append(scheduling)
            resolved.metrics.append(result["metric"])
            resolved.columns.append(result_column(result["metric"], _cell(row, "statistic"),
                                                  serving.engine_sets_batch))
        out.append(result)
    return resolved, out


def _flag(row: dict, key: str) -> bool:
    """A yes/no cell: 1, true or yes; 0, false, no or empty."""
    value = _cell(row, key).lower()
    if value not in ("", "0", "1", "true", "false", "yes", "no"):
        raise ConfigurationError(f"column {key!r} must be 1/true/yes or 0/false/no, got {_cell(row, key)!r}")
    return value in ("1", "true", "yes")


def _attention(row: dict) -> str:
    """The optional ``attention`` column: fused (FlashAttention-style, the default) or unfused."""
    value = (_cell(row, "attention") or "fused").lower()
    if value not in ("fused", "unfused"):
        raise ConfigurationError(f"column 'attention' must be fused or unfused, got {value!r}")
    return value


def predict_rows(rows: list[dict], db: Database | None = None) -> list[dict]:
    """Predicted (with its 80% interval and, where given, measured and relative error) for each input row."""
    db = db or load_database()
    resolved, out = resolve_rows(rows, db)
    if resolved.configs:
        limits = predict_resolved(resolved, physical_limit=True)
        for j, result in enumerate(predict_resolved(resolved)):
            i = resolved.positions[j]
            _fill(out[i], result, limits[j], resolved, j, rows[i])
            if resolved.saturate[j]:
                at_once = resolved.requests_at_once[j]
                out[i]["reason"] = (out[i]["reason"] + "; " if out[i]["reason"] else "") + (
                    f"{at_once:,.0f} requests sent at once; the engine runs at most {result['batch_used']} "
                    "(KV cache, max_num_seqs)" if at_once else "batch not given: evaluated at the largest batch "
                    f"the engine runs (KV cache, max_num_seqs), {result['batch_used']}")
    return out


def _fill(result: dict, r: dict, limit: dict, resolved: Resolved, j: int, row: dict) -> None:
    column, factor = resolved.columns[j]
    predicted = float(r[column]) * factor
    result["predicted"] = f"{predicted:.6g}" if math.isfinite(predicted) else ""
    if not r["fits"]:
        result["status"] = "does_not_fit"
        result["reason"] = (f"needs {r['memory_required_bytes'] / 1e9:.1f} GB per device, has "
                            f"{r['memory_available_bytes'] / 1e9:.1f} GB; prediction assumes it fits")
    config, metric = resolved.configs[j], result["metric"]
    if config.calibration is not None:   # the profile that set the device's rates; says so if another device's
        note = calibration_note(config.calibration, config.hardware)
        result["reason"] = "; ".join(filter(None, (result["reason"], note)))
    serving = resolved.serving[j]
    regime = band_regime(metric, measurement_regime(metric, config.batch, resolved.saturate[j], serving.under_load),
                         serving.single_client)
    found = measurement_band(metric, regime, config.model.shape.moe, format_family(config.weight_format.name),
                             resolved.engines[j], config.hardware.vendor, config.hardware.device_class.value,
                             _cell(row, "backend"))
    if found and math.isfinite(predicted):
        low, high, remark = row_interval(predicted, found, float(limit[column]) * factor, metric)
        result["predicted_low"], result["predicted_high"] = f"{low:.6g}", f"{high:.6g}"
        if remark:
            result["reason"] = "; ".join(filter(None, (result["reason"], f"the interval excludes it: {remark}")))
    measured = result["measured"]
    if measured not in ("", None) and math.isfinite(predicted):
        value = float(measured)
        if value > 0:
            result["rel_error"] = f"{predicted / value - 1:+.4f}"


def predict_file(in_path: str, out_path: str, db: Database | None = None, force: bool = False) -> str:
    """Read ``in_path``, write ``out_path`` atomically (never over an existing file unless ``force``)."""
    src = Path(in_path)
    prepare_output(out_path, force, "--out")     # before any work: a refused --out costs nothing
    try:
        reader = csv.DictReader(io.StringIO(read_text(src, "--csv", ConfigurationError), newline=""))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigurationError(f"--csv {src}: missing columns {missing}; required: {', '.join(REQUIRED)}")
        if unknown := unknown_columns(reader.fieldnames):
            raise ConfigurationError(f"--csv {src}: {unknown}")
        rows = [{**row, "folder": str(src.parent)} for row in reader]   # calibration paths are the file's
    except csv.Error as exc:
        raise ConfigurationError(f"--csv {src} is not a readable CSV file: {exc}") from None
    results = predict_rows(rows, db)

    def write(path: Path) -> None:
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=OUTPUT_COLUMNS, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(results)

    return summarize(results, write_atomically(out_path, write, force, "--out"))


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
