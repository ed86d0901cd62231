"""`roofline validate --published`: the estimator's measured error, cross-validated, and its intervals.

Every figure here is leave-one-source-out (:mod:`estimator.fitting`): the rows
of a source are predicted by engine parameters fitted without that source.
The prediction intervals every estimate carries are quantiles of those
held-out ratios, per engine and device group, and the coverage test uses, for
each row, an interval built without its own source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimator.dataset import Dataset, load_dataset
from estimator.db import Database, load_database
from estimator.efficiency import DEVICE_GROUPS
from estimator.fitting import PREFILL_METRICS, Problem, build_problem, cross_validate, fit_all
from estimator.report import table

TIME_METRICS = ("ttft_ms", "itl_ms", "e2e_latency_s")
INTERVAL = (0.10, 0.90)
MIN_GROUP_ROWS = 8
GROUP_OF_CLASS = {c: g for g, classes in DEVICE_GROUPS.items() for c in classes}


def phase_of(metric: str) -> str:
    return "prefill" if metric in PREFILL_METRICS else "decode"


@dataclass
class Validation:
    problem: Problem
    predicted: np.ndarray          # held-out (cross-validated) predictions
    params: dict                   # engine parameters fitted on everything

    @property
    def speed_ratio(self) -> np.ndarray:
        """Measured speed over predicted speed (time metrics inverted): > 1 means faster than predicted."""
        ratio = self.problem.measured / self.predicted
        times = np.isin(self.problem.resolved.metrics, TIME_METRICS)
        return np.where(times, 1 / ratio, ratio)

    @property
    def abs_pct_error(self) -> np.ndarray:
        return np.abs(self.predicted / self.problem.measured - 1)

    def labels(self) -> dict[str, np.ndarray]:
        configs = self.problem.resolved.configs
        return {
            "metric": np.array(self.problem.resolved.metrics),
            "phase": np.array([phase_of(m) for m in self.problem.resolved.metrics]),
            "engine": self.problem.engines,
            "device group": np.array([GROUP_OF_CLASS[c.hardware.device_class.value] for c in configs]),
            "device class": np.array([c.hardware.device_class.value for c in configs]),
            "model type": np.array(["MoE" if c.model.shape.moe else "dense" for c in configs]),
            "source": self.problem.sources,
        }


def run(dataset: Dataset | None = None, db: Database | None = None) -> Validation:
    """Fit on everything (for the shipped parameters) and cross-validate by source."""
    db = db or load_database()
    problem = build_problem(dataset or load_dataset(), db)
    return Validation(problem, cross_validate(problem), fit_all(problem))


def error_table(v: Validation, by: str) -> list[tuple]:
    """Rows of (group, n, median |error|, p90 |error|, bias) for one grouping."""
    groups = v.labels()[by]
    rows = []
    for g in sorted(set(groups)):
        mask = groups == g
        ape, signed = v.abs_pct_error[mask], v.predicted[mask] / v.problem.measured[mask] - 1
        rows.append((g, int(mask.sum()), float(np.median(ape)), float(np.quantile(ape, 0.9)),
                     float(np.median(signed))))
    return rows


def headline(v: Validation) -> dict[str, float]:
    """Cross-validated median absolute error for decode speed and for prefill/TTFT."""
    labels = v.labels()
    decode = np.isin(labels["metric"], ("decode_tps_per_seq", "decode_tps_total", "itl_ms"))
    prefill = labels["phase"] == "prefill"
    return {"decode_median_abs_error": float(np.median(v.abs_pct_error[decode])),
            "prefill_ttft_median_abs_error": float(np.median(v.abs_pct_error[prefill])),
            "all_median_abs_error": float(np.median(v.abs_pct_error)), "rows": int(len(v.predicted)),
            "sources": int(len(set(v.problem.sources)))}


def intervals(v: Validation, exclude_source: str | None = None) -> dict:
    """Quantiles of the speed ratio by engine, phase and device group (engine-wide and global fallbacks)."""
    labels = v.labels()
    keep = labels["source"] != exclude_source
    ratio = v.speed_ratio

    def quantiles(mask):
        mask = mask & keep
        if mask.sum() < MIN_GROUP_ROWS:
            return None
        return [float(x) for x in np.quantile(ratio[mask], INTERVAL)] + [int(mask.sum())]

    out = {"global": {ph: quantiles(labels["phase"] == ph) for ph in ("decode", "prefill")}}
    for eng in sorted(set(labels["engine"])):
        for ph in ("decode", "prefill"):
            base = (labels["engine"] == eng) & (labels["phase"] == ph)
            entry = out.setdefault(eng, {}).setdefault(ph, {"all": quantiles(base)})
            for group in DEVICE_GROUPS:
                entry[group] = quantiles(base & (labels["device group"] == group))
    return out


def interval_for(table_: dict, engine: str, phase: str, group: str):
    """The most specific interval available: engine and group, engine, then global; with its basis."""
    entry = table_.get(engine, {}).get(phase, {})
    for key, label in ((group, f"{engine} on {group} devices"), ("all", f"{engine}, all devices")):
        if entry.get(key):
            return entry[key], label
    found = table_["global"].get(phase)
    return found, "all engines"


def coverage(v: Validation) -> float:
    """Share of rows inside the 80% interval built without their own source."""
    labels = v.labels()
    inside = []
    for source in sorted(set(labels["source"])):
        table_ = intervals(v, exclude_source=source)
        for i in np.flatnonzero(labels["source"] == source):
            found, _ = interval_for(table_, labels["engine"][i], labels["phase"][i], labels["device group"][i])
            if found:
                inside.append(found[0] <= v.speed_ratio[i] <= found[1])
    return float(np.mean(inside))


def worst_rows(v: Validation, n: int = 10) -> list[tuple]:
    order = np.argsort(-v.abs_pct_error)[:n]
    rows = []
    for i in order:
        row = v.problem.rows[i]
        rows.append((row["id"], v.problem.engines[i], row["metric"], f"{v.problem.measured[i]:.4g}",
                     f"{v.predicted[i]:.4g}", f"{v.predicted[i] / v.problem.measured[i] - 1:+.0%}",
                     _known_reason(row)))
    return rows


def _known_reason(row: dict) -> str:
    notes = row.get("notes", "").lower()
    if "batched" in notes or row.get("metric") == "decode_tps_total":
        return "batched decode: engine-specific attention over a shared KV cache"
    if row.get("n_gpus", "1") not in ("", "1"):
        return "multi-GPU layout and interconnect"
    if "moe" in notes or "expert" in notes:
        return "MoE expert kernels"
    return ""


def format_validation(v: Validation) -> str:
    h = headline(v)
    pct = lambda x: f"{x:.0%}"  # noqa: E731
    parts = [f"Cross-validated error (leave one source out): {h['rows']} rows from {h['sources']} sources",
             f"  decode tokens/s / ITL: median |error| {pct(h['decode_median_abs_error'])}; "
             f"prefill / TTFT: {pct(h['prefill_ttft_median_abs_error'])}; all metrics: "
             f"{pct(h['all_median_abs_error'])}",
             f"  80% prediction intervals cover {pct(coverage(v))} of rows (each built without its own source)"]
    for by in ("metric", "engine", "device class", "model type"):
        parts += ["", f"By {by}", table([(g, n, pct(m), pct(p), f"{b:+.0%}") for g, n, m, p, b in error_table(v, by)],
                                        header=(by, "rows", "median |err|", "p90 |err|", "bias"))]
    parts += ["", "Worst rows", table(worst_rows(v), header=("id", "engine", "metric", "measured", "predicted",
                                                               "error", "known reason"))]
    return "\n".join(parts)
