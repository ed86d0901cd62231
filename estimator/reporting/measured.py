"""Published measurements of the same model on the same device, shown beside an estimate.

``roofline estimate`` looks up ``measurements_db/`` (only the usable rows, see
:meth:`estimator.validation.dataset.Dataset.usable`) for rows whose model and device resolve to the
estimate's, and lists them with the ratio measured / predicted for the same metric. The ratio is
given only where the row measured the same thing as the estimate (like with like):

- the same weight format (by resolved format name), device count, ``gpu_layers``, attention
  (fused or not, where the row states it) and no cached context depth;
- the same load: the same static batch (a llama-bench row is batch 1), or the same concurrency, or
  the same request rate; for a decode metric, one client in a closed loop is a batch of one;
- the same lengths: prompt and output tokens both equal; for a llama-bench row, which measures one
  phase alone (ppN: N prompt tokens, no output; tgN: N generated tokens from an empty context),
  the length of that phase: ppN against the prompt, tgN against the output. A tgN row decodes from
  an empty context while the estimate decodes after its prompt, so with a long prompt its ratio
  leans high; the row's settings are printed with it.

Other rows are still listed, with ``ratio_to_prediction`` null and their settings, so a user sees
that they measured something else. At most :data:`LIMIT` rows: same format first, then same engine,
then same load, then same device count, then those with a ratio.
"""

from __future__ import annotations

import math
from functools import lru_cache

from estimator.efficiency.engine_profiles import split_engine_name
from estimator.errors import RooflineError
from estimator.evaluation.api import Estimate
from estimator.evaluation.intervals import DECODE_METRICS, PREFILL_METRICS
from estimator.specs.database import load_database
from estimator.specs.formats import weight_format
from estimator.validation.dataset import load_dataset
from estimator.validation.metrics import METRICS

LIMIT = 10


def _int(text) -> int | None:
    try:
        return int(float(text))
    except (TypeError, ValueError):
        return None


def _float(text) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


@lru_cache(maxsize=1)
def _index() -> dict[tuple[str, str], list[tuple[dict, str | None]]]:
    """Usable rows by (resolved model name, resolved device name), each with its resolved format name."""
    db = load_database(())
    names: dict[tuple[str, str], str | None] = {}

    def resolve(kind: str, name: str) -> str | None:
        if (kind, name) not in names:
            try:
                if kind == "model":
                    names[kind, name] = db.models.get(name).name
                elif kind == "hardware":
                    names[kind, name] = db.hardware.get(name).name
                else:
                    names[kind, name] = weight_format(name).name
            except (RooflineError, ValueError):
                names[kind, name] = None
        return names[kind, name]

    index: dict[tuple[str, str], list[tuple[dict, str | None]]] = {}
    for row in load_dataset().usable():
        model, hardware = resolve("model", row["model"]), resolve("hardware", row["hardware"])
        if model and hardware:
            fmt = resolve("format", row["weight_format"]) if row.get("weight_format") else None
            index.setdefault((model, hardware), []).append((row, fmt))
    return index


def _llama_bench(row: dict) -> bool:
    """A llama-bench ppN or tgN row: one phase alone, one sequence."""
    return row.get("engine") == "llama.cpp" and (_int(row.get("input_len")) == 0 or _int(row.get("output_len")) == 0)


def settings(row: dict) -> dict:
    """The row's load and lengths, as printed beside it."""
    batch = _int(row.get("batch"))
    if batch is None and _llama_bench(row):
        batch = 1
    return {"batch": batch, "concurrency": _int(row.get("concurrency")),
            "request_rate": _float(row.get("request_rate")), "input_len": _int(row.get("input_len")),
            "output_len": _int(row.get("output_len")), "n_gpus": _int(row.get("n_gpus")),
            "context_depth": _int(row.get("context_depth")) or 0,
            "attention_dp": (row.get("attention_dp") or "").strip().lower() in ("1", "true", "yes")}


def _one_sequence(batch, concurrency, rate) -> bool:
    """One request at a time: a single client in a closed loop, or a static batch of one."""
    return not rate and (concurrency == 1 or (not concurrency and batch == 1))


def same_load(e: Estimate, s: dict, metric: str | None = None) -> bool:
    """The same static batch, concurrency or request rate as the estimate. For a decode metric a batch of one and a
    single client in a closed loop are the same load: with no queue and no other prompt in its steps, the client's
    gap between tokens is the batch-1 decode step (docs/formulas.md §9, "A single client's decode"). Its time to
    the first token also carries the server's front end (tokenizing, HTTP), so prefill metrics keep to their own
    load."""
    serving = e.serving
    if metric in DECODE_METRICS and _one_sequence(e.batch, serving.concurrency, serving.rate) \
            and _one_sequence(s["batch"], s["concurrency"], s["request_rate"]):
        return True
    if serving.concurrency:
        return s["concurrency"] == serving.concurrency
    if serving.rate:
        return s["request_rate"] is not None and math.isclose(s["request_rate"], serving.rate, rel_tol=1e-6)
    return s["batch"] == e.batch and not s["concurrency"] and not s["request_rate"]


def same_lengths(e: Estimate, row: dict, s: dict) -> bool:
    """Prompt and output lengths as the estimate's; for a llama-bench row, the length of its one phase."""
    if _llama_bench(row):
        if s["output_len"] == 0 and row["metric"] in PREFILL_METRICS:
            return s["input_len"] == e.prompt_tokens
        if s["input_len"] == 0 and row["metric"] in DECODE_METRICS:
            return s["output_len"] == e.output_tokens
        return False
    return s["input_len"] == e.prompt_tokens and s["output_len"] == e.output_tokens


def predicted(e: Estimate, metric: str) -> float | None:
    """The estimate's value of a measurements_db metric, in that metric's unit (None when there is none)."""
    if metric not in METRICS or not e.runnable:
        return None
    column, factor = METRICS[metric]
    value = e.results.get(column)
    if value is None or not math.isfinite(value):
        return None
    return float(value) * factor


def _comparable(e: Estimate, row: dict, fmt: str | None, s: dict) -> bool:
    """Everything but the load (:func:`same_load`) as the estimate's."""
    return (fmt == e.weight_format.name and s["n_gpus"] == e.layout.devices and s["context_depth"] == 0
            and s["attention_dp"] == e.layout.attention_dp
            and _int(row.get("gpu_layers")) == e.serving.gpu_layers
            and row.get("attention") in ("", None, e.serving.attention)
            and same_lengths(e, row, s))


def measured_rows(e: Estimate, limit: int = LIMIT) -> list[dict]:
    """Published measurements of this model on this device, closest first, with measured / predicted."""
    found, engine = [], split_engine_name(e.engine)[0].lower()
    for row, fmt in _index().get((e.model.name, e.hardware.name), []):
        value, s = _float(row["value"]), settings(row)
        prediction, load = predicted(e, row["metric"]), same_load(e, s, row["metric"])
        ratio = (value / prediction if value is not None and prediction and load and _comparable(e, row, fmt, s)
                 else None)
        found.append({
            "metric": row["metric"], "value": value, "unit": row.get("unit") or "",
            "statistic": row.get("statistic") or None,
            "engine": row.get("engine") or row.get("framework") or None, "source": row["source"],
            "date": row.get("date") or None, "id": row["id"], "weight_format": fmt or row.get("weight_format"),
            "ratio_to_prediction": ratio if ratio is None or math.isfinite(ratio) else None,
            "predicted": prediction if ratio is not None else None, "settings": s,
            "_rank": (fmt != e.weight_format.name, (row.get("engine") or "").lower() != engine,
                      not load, s["n_gpus"] != e.layout.devices, ratio is None, row["metric"], row["id"]),
        })
    found.sort(key=lambda r: r["_rank"])
    return [{k: v for k, v in r.items() if k != "_rank"} for r in found[:limit]]


def _settings_text(s: dict) -> str:
    load = (f"concurrency {s['concurrency']}" if s["concurrency"] else
            f"{s['request_rate']:g} req/s" if s["request_rate"] else
            f"batch {s['batch']}" if s["batch"] is not None else "engine-chosen batch")
    depth = f", depth {s['context_depth']}" if s["context_depth"] else ""
    layout = ", attention DP" if s["attention_dp"] else ""
    return f"{load}, in {s['input_len']}, out {s['output_len']}{depth}, {s['n_gpus']} dev{layout}"


def format_measured(rows: list[dict]) -> str:
    """The text section: one line per measurement, the ratio or why there is none."""
    title = "Measured (measurements_db, same model and device)"
    if not rows:
        return f"{title}: none published; see `roofline validate` for the error on other configurations."
    lines = [title]
    for r in rows:
        ratio = (f"measured/predicted {r['ratio_to_prediction']:.2f}" if r["ratio_to_prediction"] is not None
                 else "other setting, no ratio")
        lines.append(f"  {r['metric']} {r['value']:,.4g} {r['unit']} ({ratio}); {r['weight_format']}, "
                     f"{_settings_text(r['settings'])}; {r['engine']}, {r['source']}, {r['date'] or 'undated'}")
    return "\n".join(lines)
