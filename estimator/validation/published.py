"""`roofline validate --published`: the estimator's measured error, cross-validated, and its intervals.

Every figure here is leave-one-source-out (:mod:`estimator.validation.cross_validation`): the rows
of a source are predicted by engine parameters fitted without that source, and rows the estimator
thinks do not fit in memory count too (predicted as if they fitted; they ran). The prediction
intervals are calibrated on those held-out residuals (:mod:`estimator.validation.interval_calibration`);
coverage and width are judged, for each source, on intervals built from the other sources only.
Serving rows (driven by a client concurrency or request rate) are reported as their own phase and
are not in the headline figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from estimator.efficiency.defaults import GROUP_OF_CLASS
from estimator.errors import ConfigurationError
from estimator.evaluation.intervals import (
    PHASE_OF_REGIME,
    PREFILL_METRICS,
    THROUGHPUT_METRICS,
    TIME_METRICS,
    band_regime,
    cell_path,
    default_backend,
    measurement_regime,
)
from estimator.formatting import table
from estimator.specs.database import Database, load_database
from estimator.specs.formats import format_family
from estimator.validation import result_cache
from estimator.validation.cross_validation import cross_validate
from estimator.validation.dataset import Dataset, load_dataset
from estimator.validation.fit_record import fit_record
from estimator.validation.fitting import GENERIC, Problem, build_problem, fit_all, require_fit_extra
from estimator.validation.interval_calibration import HeldOutBands, Residuals, held_out_bands, shipped_table

HEADLINE_METRICS = {"decode": ("decode_tps_per_seq", "decode_tps_total", "itl_ms"),
                    "prefill": PREFILL_METRICS, "throughput": THROUGHPUT_METRICS}
PHASES = ("decode", "prefill", "throughput", "serving")
SPLITS = ("engine", "backend", "device group", "format family", "measurement year")


@dataclass
class Validation:
    problem: Problem
    predicted: np.ndarray          # held-out (cross-validated) predictions
    params: dict                   # engine parameters fitted on everything
    jobs: int | None = None        # worker processes for the bands (None: one per core)
    from_cache: bool = False       # loaded from a kept result (result_cache), not computed in this call
    # computed once; not copied by dataclasses.replace, so a validation of other rows labels afresh
    _labels: dict | None = field(default=None, init=False, repr=False)

    @property
    def speed_ratio(self) -> np.ndarray:
        """Measured speed over predicted speed (time metrics inverted): > 1 means faster than predicted."""
        return self._measured_speed_over(self.predicted)

    @property
    def speed_over_limit(self) -> np.ndarray:
        """Measured speed over the physical limit's (time metrics inverted): > 1 means faster than physics allows."""
        return self._measured_speed_over(self.problem.limit)

    def _measured_speed_over(self, other: np.ndarray) -> np.ndarray:
        ratio = self.problem.measured / other
        return np.where(self._times, 1 / ratio, ratio)

    @property
    def _times(self) -> np.ndarray:
        return np.isin(self.problem.resolved.metrics, TIME_METRICS)

    @property
    def abs_pct_error(self) -> np.ndarray:
        return np.abs(self.predicted / self.problem.measured - 1)

    def labels(self) -> dict[str, np.ndarray]:
        """Each row's metric, regime, phase, engine, backend, device group and class, format family, model type,
        measurement year and source (computed once: every table of the report groups by them)."""
        if self._labels is None:
            self._labels = self._row_labels()
        return self._labels

    def _row_labels(self) -> dict[str, np.ndarray]:
        r = self.problem.resolved
        regimes = [measurement_regime(m, c.batch, sat, s.under_load)
                   for m, c, sat, s in zip(r.metrics, r.configs, r.saturate, r.serving)]
        band_regimes = [band_regime(m, g, s.single_client) for m, g, s in zip(r.metrics, regimes, r.serving)]
        backends = [row.get("backend") or default_backend(c.hardware.vendor, c.hardware.device_class.value)
                    for row, c in zip(self.problem.rows, r.configs)]
        return {
            "metric": np.array(r.metrics),
            "regime": np.array(regimes),
            "phase": np.array([PHASE_OF_REGIME[g] for g in regimes]),
            # the cells that give the row its band, and the phase whose widening it takes (band_regime)
            "band regime": np.array(band_regimes),
            "engine": self.problem.engines,
            "backend": np.array([b or "unstated" for b in backends]),
            "device group": np.array([GROUP_OF_CLASS[c.hardware.device_class.value] for c in r.configs]),
            "device class": np.array([c.hardware.device_class.value for c in r.configs]),
            "format family": np.array([format_family(c.weight_format.name) for c in r.configs]),
            "model type": np.array(["MoE" if c.model.shape.moe else "dense" for c in r.configs]),
            # the year a row was measured (or, where that is all a source says, published: measurements_db/SCHEMA.md)
            "measurement year": np.array([(row.get("date") or "")[:4] or "undated" for row in self.problem.rows]),
            "source": self.problem.sources,
        }

    def residuals(self) -> Residuals:
        labels = self.labels()
        limit_ratio = self.problem.limit / self.predicted
        regimes = labels["band regime"]
        paths = [cell_path(g, t == "MoE", e, d, b, f) for g, t, e, d, b, f in
                 zip(regimes, labels["model type"], labels["engine"], labels["device group"],
                     labels["backend"], labels["format family"])]
        return Residuals(np.log(self.speed_ratio), np.log(np.where(self._times, 1 / limit_ratio, limit_ratio)),
                         paths, np.array([PHASE_OF_REGIME[g] for g in regimes]), self.problem.sources)

    @cached_property
    def bands(self) -> HeldOutBands:
        """Each row's 80% band built without its own source."""
        return held_out_bands(self.residuals(), self.jobs)


def run(dataset: Dataset | None = None, db: Database | None = None, jobs: int | None = None,
        progress=None, cache: bool = True) -> Validation:
    """Fit on everything (for the shipped parameters) and cross-validate by source, in ``jobs`` worker processes
    (None: one per core; the figures do not depend on it); ``progress(done, total)`` follows the folds.

    With ``cache``, a result already computed from the same dataset, databases, code and library versions is
    loaded instead (:mod:`estimator.validation.result_cache`), and a new one is kept with its bands."""
    db = db or load_database()
    dataset = dataset or load_dataset()
    key = result_cache.validation_key(dataset, db) if cache else None
    kept = key and result_cache.load(key)
    if isinstance(kept, Validation):
        kept.from_cache = True
        return kept
    require_fit_extra()   # before a minute of work, not at the first fit
    problem = build_problem(dataset, db, jobs)
    result = Validation(problem, cross_validate(problem, jobs=jobs, progress=progress), fit_all(problem, jobs), jobs)
    if key:
        result.bands   # computed now (another tenth of the time), so the kept entry holds them too
        result_cache.store(key, result)
    return result


def _errors(v: Validation, mask: np.ndarray) -> dict:
    """Error figures over ``mask``; a serving row the model calls saturated has no latency to compare."""
    predicted = mask & np.isfinite(v.predicted)
    ape = v.abs_pct_error[predicted]
    out = {"rows": int(predicted.sum()), "saturated": int((mask & ~predicted).sum())}
    if not len(ape):
        return {**out, "median_abs_error": None, "p90_abs_error": None, "bias": None}
    signed = v.predicted[predicted] / v.problem.measured[predicted] - 1
    return {**out, "median_abs_error": float(np.median(ape)), "p90_abs_error": float(np.quantile(ape, 0.9)),
            "bias": float(np.median(signed))}


def _phase_masks(v: Validation) -> dict[str, np.ndarray]:
    labels = v.labels()
    serving = labels["phase"] == "serving"
    masks = {phase: np.isin(labels["metric"], metrics) & ~serving for phase, metrics in HEADLINE_METRICS.items()}
    masks["serving"] = serving
    return masks


def error_table(v: Validation, by: str) -> list[tuple]:
    """Rows of (group, n, median |error|, p90 |error|, bias) for one grouping."""
    groups = v.labels()[by]
    rows = []
    for g in sorted(set(groups)):
        e = _errors(v, groups == g)
        rows.append((str(g), e["rows"], e["median_abs_error"], e["p90_abs_error"], e["bias"]))
    return rows


def interval_quality(v: Validation, mask: np.ndarray) -> dict:
    """Out-of-source coverage of the 80% band and its median width (high / low), over ``mask``."""
    bands = v.bands
    judged = mask & ~np.isnan(bands.low)
    if not judged.any():
        return {"rows": 0, "coverage": None, "median_width": None}
    return {"rows": int(judged.sum()), "coverage": float(bands.inside[judged].mean()),
            "median_width": float(np.median(bands.high[judged] / bands.low[judged]))}


def fit_failures(v: Validation) -> dict:
    ids = [row["id"] for row, ok in zip(v.problem.rows, v.problem.fits) if not ok]
    return {"count": len(ids), "ids": ids}


def beyond_physical_limit(v: Validation) -> dict:
    """Rows measured faster than their physical limit: 100% of datasheet bandwidth and peak and no overheads, on
    the estimate's own reading of the configuration (its bytes, FLOPs, expert routing and layout). No run can
    beat that, so each such row is a wrong datum or a run that breaks one of those readings, as
    llama-batched-bench's random-token batches touch fewer experts than uniform routing (docs/formulas.md §9);
    counted, never dropped."""
    speed_over_limit = v.speed_over_limit
    beyond = np.isfinite(speed_over_limit) & (speed_over_limit > 1)
    phases = v.labels()["phase"]
    order = np.flatnonzero(beyond)[np.argsort(-speed_over_limit[beyond], kind="stable")]
    return {"count": int(beyond.sum()), "by_phase": {p: int((beyond & (phases == p)).sum()) for p in PHASES},
            "rows": [{"id": v.problem.rows[i]["id"], "source": str(v.problem.sources[i]),
                      "metric": v.problem.rows[i]["metric"], "measured": float(v.problem.measured[i]),
                      "limit": float(v.problem.limit[i]), "speed_over_limit": float(speed_over_limit[i])}
                     for i in order]}


def headline(v: Validation) -> dict:
    """Cross-validated median and P90 |error| per phase, interval coverage and width, fit failures."""
    masks = _phase_masks(v)
    out = {phase: {**_errors(v, mask), "interval": interval_quality(v, mask)} for phase, mask in masks.items()}
    decode, prefill = out["decode"], out["prefill"]
    return {"decode_median_abs_error": decode["median_abs_error"], "decode_p90_abs_error": decode["p90_abs_error"],
            "prefill_ttft_median_abs_error": prefill["median_abs_error"],
            "prefill_ttft_p90_abs_error": prefill["p90_abs_error"],
            "throughput_median_abs_error": out["throughput"]["median_abs_error"],
            "all_median_abs_error": float(np.nanmedian(v.abs_pct_error)), "rows": int(len(v.predicted)),
            "sources": int(len(set(v.problem.sources))),
            "devices": int(len({c.hardware.name for c in v.problem.resolved.configs})),
            "fit_failures": int((~v.problem.fits).sum()), "phases": out}


def splits(v: Validation) -> dict:
    """Error and interval quality per phase, split by engine, backend, device group, format family and the year
    measured."""
    labels, masks = v.labels(), _phase_masks(v)
    out = {}
    for by in SPLITS:
        for group in sorted(set(labels[by])):
            for phase, mask in masks.items():
                cell = mask & (labels[by] == group)
                if cell.any():
                    out.setdefault(by, {}).setdefault(str(group), {})[phase] = {
                        **_errors(v, cell), "interval": interval_quality(v, cell)}
    return out


def parameters_on_bound(v: Validation) -> list[tuple[str, str, float, float]]:
    """(engine, parameter, value, bound) for each fitted parameter that ended on a bound: a missing mechanism."""
    out = []
    for name in sorted(v.params):
        if name == GENERIC:
            continue
        for key, p in fit_record(v.problem, name)["parameters"].items():
            if p["on_bound"]:
                bound = min(p["lower"], p["upper"], key=lambda b: abs(np.log(p["value"] / b)))
                out.append((name, key, p["value"], bound))
    return out


def to_json(v: Validation) -> dict:
    """What `roofline validate --published --json` prints."""
    return {"headline": headline(v), "fit_failures": fit_failures(v), "beyond_physical_limit": beyond_physical_limit(v),
            "splits": splits(v),
            "parameters": {name: fit_record(v.problem, name) for name in sorted(v.params) if name != GENERIC}}


def worst_rows(v: Validation, n: int = 10) -> list[tuple]:
    order = np.argsort(-np.nan_to_num(v.abs_pct_error, nan=-1.0))[:n]
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
    pct = lambda x: "-" if x is None else f"{x:.0%}"  # noqa: E731
    width = lambda x: "-" if x is None else f"{x:.2f}x"  # noqa: E731
    parts = [f"Cross-validated error (leave one source out): {h['rows']} rows from {h['sources']} sources on "
             f"{h['devices']} devices; {h['fit_failures']} rows that ran are predicted not to fit (counted, "
             "predicted as if they fitted)",
             table([(phase, p["rows"], pct(p["median_abs_error"]), pct(p["p90_abs_error"]), pct(p["bias"]),
                     pct(p["interval"]["coverage"]), width(p["interval"]["median_width"]))
                    for phase, p in h["phases"].items()],
                   header=("phase", "rows", "median |err|", "p90 |err|", "bias", "80% coverage", "median width")),
             "  coverage and width: each source judged on an interval built from the other sources only; serving "
             "rows (client concurrency or request rate) are not in the headline"]
    for by in ("metric", "engine", "backend", "device group", "format family", "model type", "measurement year"):
        parts += ["", f"By {by}", table([(g, n, pct(m), pct(p), pct(b)) for g, n, m, p, b in error_table(v, by)],
                                        header=(by, "rows", "median |err|", "p90 |err|", "bias"))]
    on_bound = parameters_on_bound(v)
    parts += ["", f"Fitted parameters on a bound: {len(on_bound)}",
              "  a parameter the data push against a physical bound stands in for a mechanism the model lacks",
              table([(e, k, f"{x:.4g}", f"{b:.4g}") for e, k, x, b in on_bound],
                    header=("engine", "parameter", "value", "bound"))]
    parts += ["", "Worst rows", table(worst_rows(v), header=("id", "engine", "metric", "measured", "predicted",
                                                               "error", "known reason"))]
    beyond = beyond_physical_limit(v)
    parts += ["", f"Measured beyond the physical limit: {beyond['count']} rows",
              "  faster than 100% of datasheet with no overheads, on the estimate's bytes, routing and layout: each is "
              "a wrong datum or a run that breaks one of those readings",
              table([(r["id"], r["metric"], f"{r['measured']:.4g}", f"{r['limit']:.4g}",
                      f"{r['speed_over_limit']:.2f}x") for r in beyond["rows"][:10]],
                    header=("id", "metric", "measured", "limit", "speed / limit"))]
    return "\n".join(parts)


def write_results(v: Validation, folder) -> list[str]:
    """Write the fitted parameters into each engine's YAML and the calibrated intervals beside them."""
    from pathlib import Path

    import yaml

    from estimator.efficiency.calibration_profile import now_iso
    from estimator.efficiency.engine_profiles import INTERVALS_FILE, engine, split_engine_name

    folder = Path(folder)
    h = headline(v)
    labels = v.labels()
    written = []
    documents = {}
    for name, params in sorted(v.params.items()):
        if name == GENERIC:
            continue
        base, backend = split_engine_name(name)
        profile = engine(base)
        path = next((p for p in folder.glob("*.yaml")
                     if not p.name.startswith("_") and yaml.safe_load(p.read_text()).get("name") == profile.name), None)
        if path is None:
            raise ConfigurationError(f"--write {folder}: no engine file named {profile.name!r} there; give the "
                                     "engines_db folder")
        doc = documents.setdefault(path, yaml.safe_load(path.read_text()))
        mask = labels["engine"] == name
        by_metric = {str(m): round(e, 4) for m in sorted(set(labels["metric"][mask]))
                     if (e := _errors(v, mask & (labels["metric"] == m))["median_abs_error"]) is not None}
        fitted = {"parameters": {k: _rounded(val) for k, val in params.model_dump().items()},
                  "fit": {"dataset_rows": int(mask.sum()), "sources": sorted({str(x) for x in labels["source"][mask]}),
                          "date": now_iso()[:10], "loso_median_abs_error": by_metric,
                          "parameters": fit_record(v.problem, name)["parameters"]}}
        if backend:
            doc.setdefault("backends", {})[backend] = fitted
        else:
            doc.update(fitted)
    for path, doc in documents.items():
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        written.append(str(path))
    stored = shipped_table(v.residuals())
    (folder / INTERVALS_FILE).write_text(yaml.safe_dump({
        **stored, "out_of_source_coverage": _rounded(h["phases"]["decode"]["interval"]["coverage"]),
        "headline": _rounded({k: val for k, val in h.items() if k != "phases"}),
        "phases": _rounded(h["phases"]), "date": now_iso()[:10]}, sort_keys=False))
    written.append(str(folder / INTERVALS_FILE))
    return written


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value
