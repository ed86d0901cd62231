"""`roofline validate --published`: the estimator's measured error, cross-validated, and its intervals.

Every figure here is leave-one-source-out (:mod:`estimator.validation.fitting`): the rows
of a source are predicted by engine parameters fitted without that source.
The prediction intervals every estimate carries are quantiles of those
held-out ratios, per engine and device group, and the coverage test uses, for
each row, an interval built without its own source.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimator.efficiency.defaults import DEVICE_GROUPS
from estimator.evaluation.intervals import GROUP_OF_CLASS, interval_for
from estimator.formatting import table
from estimator.specs.database import Database, load_database
from estimator.validation.cross_validation import cross_validate
from estimator.validation.dataset import Dataset, load_dataset
from estimator.validation.fitting import GENERIC, PREFILL_METRICS, Problem, build_problem, fit_all

TIME_METRICS = ("ttft_ms", "itl_ms", "e2e_latency_s")
TARGET_COVERAGE = 0.80
LEVELS = (0.10, 0.90)
# Errors of a new source are not exchangeable with those of the sources already seen (each engine
# version and benchmark brings its own bias), so the 10th-90th percentiles of past residuals cover
# fewer than 80% of a new source's rows. The interval is therefore widened in log space around the
# median by a factor k, the smallest of these whose leave-one-source-out coverage reaches 80%
# (a conformal calibration with sources as the exchangeable units).
WIDENING = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0)
MIN_GROUP_ROWS = 8


def phase_of(metric: str) -> str:
    return "prefill" if metric in PREFILL_METRICS else "decode"


@dataclass
class Validation:
    problem: Problem
    predicted: np.ndarray          # held-out (cross-validated) predictions
    params: dict                   # engine parameters fitted on everything
    widening: tuple | None = None  # (k, coverage), found on first use

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


def intervals(v: Validation, exclude_source: str | None = None, widening: float = 1.0) -> dict:
    """Speed-ratio intervals by engine, phase and device group (engine-wide and global fallbacks).

    Each is the 10th-90th percentile range of the held-out ratios, widened by ``widening``
    in log space around their median; entries are [low, high, rows].
    """
    labels = v.labels()
    keep = labels["source"] != exclude_source
    ratio = v.speed_ratio

    def quantiles(mask):
        mask = mask & keep
        if mask.sum() < MIN_GROUP_ROWS:
            return None
        logs = np.log(ratio[mask])
        centre = np.median(logs)
        low, high = np.quantile(logs, LEVELS)
        return [round(float(np.exp(centre + widening * (low - centre))), 4),
                round(float(np.exp(centre + widening * (high - centre))), 4), int(mask.sum())]

    out = {"global": {ph: quantiles(labels["phase"] == ph) for ph in ("decode", "prefill")}}
    for eng in sorted({str(e) for e in labels["engine"]}):
        for ph in ("decode", "prefill"):
            base = (labels["engine"] == eng) & (labels["phase"] == ph)
            entry = out.setdefault(eng, {}).setdefault(ph, {"all": quantiles(base)})
            for group in DEVICE_GROUPS:
                entry[group] = quantiles(base & (labels["device group"] == group))
    return out


def coverage(v: Validation, widening: float = 1.0) -> float:
    """Share of rows inside the interval built, with this widening, without their own source."""
    labels = v.labels()
    inside = []
    for source in sorted(set(labels["source"])):
        table_ = intervals(v, exclude_source=source, widening=widening)
        for i in np.flatnonzero(labels["source"] == source):
            found, _ = interval_for(table_, labels["engine"][i], labels["phase"][i], labels["device group"][i])
            if found:
                inside.append(found[0] <= v.speed_ratio[i] <= found[1])
    return float(np.mean(inside))


def calibrated_widening(v: Validation) -> tuple[float, float]:
    """The smallest widening whose out-of-source coverage reaches the target, and that coverage."""
    if v.widening is None:
        v.widening = _search_widening(v)
    return v.widening


def _search_widening(v: Validation) -> tuple[float, float]:
    for k in WIDENING:
        covered = coverage(v, k)
        if covered >= TARGET_COVERAGE:
            return k, covered
    return WIDENING[-1], covered


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


def _widening_text(v: Validation) -> tuple[float, str]:
    k, covered = calibrated_widening(v)
    return k, f"{covered:.0%}"


def format_validation(v: Validation) -> str:
    h = headline(v)
    pct = lambda x: f"{x:.0%}"  # noqa: E731
    parts = [f"Cross-validated error (leave one source out): {h['rows']} rows from {h['sources']} sources",
             f"  decode tokens/s / ITL: median |error| {pct(h['decode_median_abs_error'])}; "
             f"prefill / TTFT: {pct(h['prefill_ttft_median_abs_error'])}; all metrics: "
             f"{pct(h['all_median_abs_error'])}",
             "  80% prediction intervals: the 10th-90th percentile of held-out ratios widened {:g}x covers {} of "
             "rows, each built without its own source".format(*_widening_text(v))]
    for by in ("metric", "engine", "device class", "model type"):
        parts += ["", f"By {by}", table([(g, n, pct(m), pct(p), f"{b:+.0%}") for g, n, m, p, b in error_table(v, by)],
                                        header=(by, "rows", "median |err|", "p90 |err|", "bias"))]
    parts += ["", "Worst rows", table(worst_rows(v), header=("id", "engine", "metric", "measured", "predicted",
                                                               "error", "known reason"))]
    return "\n".join(parts)




def write_results(v: Validation, folder) -> list[str]:
    """Write the fitted parameters into each engine's YAML and the calibrated intervals beside them."""
    from pathlib import Path

    import yaml

    from estimator.efficiency.calibration_profile import now_iso
    from estimator.efficiency.engine_profiles import INTERVALS_FILE, engine

    folder = Path(folder)
    h = headline(v)
    labels = v.labels()
    written = []
    for name, params in v.params.items():
        if name == GENERIC:
            continue
        profile = engine(name)
        path = next(p for p in folder.glob("*.yaml")
                    if not p.name.startswith("_") and yaml.safe_load(p.read_text()).get("name") == profile.name)
        doc = yaml.safe_load(path.read_text())
        mask = labels["engine"] == name
        by_metric = {str(m): round(float(np.median(v.abs_pct_error[mask & (labels["metric"] == m)])), 4)
                     for m in sorted(set(labels["metric"][mask]))}
        doc["parameters"] = {k: _rounded(val) for k, val in params.model_dump().items()}
        doc["fit"] = {"dataset_rows": int(mask.sum()), "sources": sorted({str(x) for x in labels["source"][mask]}),
                      "date": now_iso()[:10], "loso_median_abs_error": by_metric}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(str(path))
    k, covered = calibrated_widening(v)
    table_ = intervals(v, widening=k)
    (folder / INTERVALS_FILE).write_text(yaml.safe_dump({
        "widening": k, "levels": list(LEVELS), "out_of_source_coverage": round(covered, 4),
        "headline": {key: (round(val, 4) if isinstance(val, float) else val) for key, val in h.items()},
        "date": now_iso()[:10], "intervals": table_}, sort_keys=False))
    written.append(str(folder / INTERVALS_FILE))
    return written


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
