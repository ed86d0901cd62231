"""Prediction intervals grounded in measured error, capped by physics.

``roofline validate --published --write`` stores, for every cell of regime × model type (dense or MoE) ×
engine × device group × (for decode and prefill) weight-format family × backend, the 10th, 50th and 90th
percentiles of log(measured / predicted speed) over held-out rows
(:mod:`estimator.validation.interval_calibration`). A cell is read through its parents (the regime over all
models and engines, then dense or MoE models, then the engine, then the engine on that device group, then
that format family, then that backend), each level shrunk towards the one above (hierarchical shrinkage).
A level weighs as many sources as its rows come from, against ``prior_sources`` pseudo-sources for its
parent: rows of one campaign share its setup and its offset from the model, so a cell of 300 rows from
one campaign says less about the next campaign than a cell of 30 rows from ten. The band around the
median is widened by the stored factor ``k``, chosen on held-out sources to cover 80% of rows.

Physics caps every interval: no upper speed beats the roofline at 100% of datasheet bandwidth and
of the peak the estimate uses (``physical_limit`` columns), and no lower time undercuts it.
"""

from __future__ import annotations

import numpy as np

from estimator.efficiency.defaults import GROUP_OF_CLASS
from estimator.efficiency.engine_profiles import load_intervals

# The widening is chosen per phase (a regime's parent), so each phase's coverage reaches 80%. A single client's
# decode (band_regime) takes a widening of its own: its runs, judged but never fitted, spread wider than static
# batches of one (docs/formulas.md §9).
PHASE_OF_REGIME = {"decode_b1": "decode", "decode_batched": "decode", "prefill": "prefill",
                   "throughput": "throughput", "serving": "serving", "decode_one_client": "decode_one_client"}
# A regime that reads another's cells: a single client's decode shares the batch-1 decodes'.
CELLS_OF_REGIME = {"decode_one_client": "decode_b1"}
# Regimes whose interval cells part by weight-format family (see cell_path).
FORMAT_REGIMES = ("decode_b1", "decode_batched", "prefill", "decode_one_client")
# Speeds (and the times that are their inverses) an estimate carries intervals for, by regime.
DECODE = (("decode_tps_per_seq", "decode_tps_total", "throughput_out_tps"), ("itl_s", "tpot_inclusive_s",
                                                                              "e2e_latency_s"))
PREFILL = (("prefill_tps",), ("ttft_s",))
# The columns of a single client's decode (:func:`band_regime`): per-token figures, without its first token.
SINGLE_CLIENT_DECODE = (("decode_tps_per_seq", "decode_tps_total"), ("itl_s",))
THROUGHPUT_COLUMNS = ("throughput_out_tps",)   # the run's output tokens/s: max-throughput in an all-at-once run
BACKEND_OF_VENDOR = {"NVIDIA": "cuda", "AMD": "rocm", "Apple": "metal", "Intel": "sycl"}
# Measured metrics by regime (the names of measurements_db/SCHEMA.md).
PREFILL_METRICS = ("prefill_tps", "ttft_ms")
DECODE_METRICS = ("decode_tps_per_seq", "decode_tps_total", "itl_ms")
THROUGHPUT_METRICS = ("throughput_out_tps", "throughput_out_tps_per_gpu")
TIME_METRICS = ("ttft_ms", "itl_ms", "e2e_latency_s")


def measurement_regime(metric: str, batch: int, offline: bool, under_load: bool) -> str:
    """The regime a measured metric belongs to: serving, prefill, max-throughput, or decode at batch 1 or more.

    A latency measured in an offline run (every request sent at once) is mostly the wait in the queue:
    it belongs with the serving rows, not with prefill or decode.
    """
    if under_load or (offline and metric in TIME_METRICS):
        return "serving"
    if metric in PREFILL_METRICS:
        return "prefill"
    if metric in THROUGHPUT_METRICS:
        return "throughput"
    return "decode_b1" if batch <= 1 and not offline else "decode_batched"


def band_regime(metric: str, regime: str, single_client: bool) -> str:
    """The regime that gives a measured metric its band: its own, except that a single client's decode (ITL,
    decode tokens/s) is ``decode_one_client``, which reads the batch-1 decode cells. With no request queued and no
    other prompt in its steps, one client's gap between tokens is the batch-1 decode step (docs/formulas.md §9,
    "A single client's decode"), so the runs of either kind judge the other; the client's time to the first token
    also carries the server's front end and stays a serving figure. Fitting still leaves every serving row out
    (the rows of MoE models under vLLM and SGLang run up to 4x slower than any fitted parameter explains, §9):
    their residuals widen the batch-1 bands instead."""
    return "decode_one_client" if single_client and regime == "serving" and metric in DECODE_METRICS else regime


def measurement_band(metric: str, regime: str, moe: bool, family: str, engine: str, vendor: str, device_class: str,
                     backend: str = ""):
    """The shipped 80% band (low, high) of measured / predicted for one measured metric; None when none.

    For a time metric the band is of the time (the speed band inverted).
    """
    stored = _shipped()
    found = stored and shipped_band(stored, regime, moe, family, engine, GROUP_OF_CLASS[device_class],
                                    backend or default_backend(vendor, device_class))
    if not found:
        return None
    low, high = found
    return (1 / high, 1 / low) if metric in TIME_METRICS else (low, high)


def _shipped() -> dict | None:
    """The intervals `validate --published --write` shipped, when there are any."""
    stored = load_intervals()
    return stored if stored is not None and "cells" in stored else None


def shipped_band(stored: dict, regime: str, moe: bool, family: str, engine: str, group: str,
                 backend: str) -> tuple[float, float] | None:
    """Low and high ratio measured / predicted of one cell path, shrunk and widened; None when the regime has no
    rows."""
    q = shrunk_quantiles(stored["cells"], cell_path(regime, moe, engine, group, backend, family),
                         stored["prior_sources"])
    return None if q is None else band(q, widening_for(stored, regime))


def default_backend(vendor: str, device_class: str) -> str:
    """The backend an engine runs on a device unless told otherwise (on a CPU: cpu)."""
    if device_class == "cpu":
        return "cpu"
    return BACKEND_OF_VENDOR.get(vendor, "")


def model_type(moe: bool) -> str:
    return "moe" if moe else "dense"


def cell_path(regime: str, moe: bool, engine: str, group: str, backend: str, family: str) -> list[tuple[str, ...]]:
    """The cells of one row, most general first. Dense and MoE models part right under the regime: the
    expert kernels' errors differ from the dense GEMMs' on every engine (held out, llama.cpp's MoE prompt
    processing runs 1.3-1.6x slower than predicted where its dense one runs 0.6x), and an interval that
    mixes them covers neither.

    In decode and prefill (:data:`FORMAT_REGIMES`) the weight-format ``family``
    (:func:`~estimator.specs.formats.format_family`) parts an engine's rows on a device group before the
    backend does: a format has kernels of its own (a dequantizing GEMV, a quantized-matmul prompt kernel),
    whose share of the roofline differs from the next format's. Held out, when it came in (2,840 rows, cells
    weighed by rows), the split narrowed the median 80% band from 1.82x to 1.69x (decode) and from 2.85x to
    2.32x (prefill) at 78% and 81% coverage. In max-throughput it widened the band from 1.74x to 2.24x (its
    FP4 rows differ more between publishers than all formats do pooled), so there the family is no level."""
    kind = model_type(moe)
    regime = CELLS_OF_REGIME.get(regime, regime)
    top = [(regime,), (regime, kind), (regime, kind, engine), (regime, kind, engine, group)]
    if regime in FORMAT_REGIMES:
        return [*top, (regime, kind, engine, group, family), (regime, kind, engine, group, family, backend)]
    return [*top, (regime, kind, engine, group, backend)]


def cell_key(cell: tuple[str, ...]) -> str:
    return "|".join(cell)


def shrunk_quantiles(cells: dict, path: list[tuple[str, ...]], prior_sources: float):
    """Quantiles (q10, q50, q90) of the deepest cell on ``path``, each level shrunk towards its parent.

    ``cells`` maps a cell key to [q10, q50, q90, rows, sources]. A level weighs its number of sources
    against ``prior_sources`` for the parent; a level with its parent's rows (a nested cell that holds
    them all) adds no evidence and is passed over, so it cannot pull the band further from the parent.
    None when the regime has no rows at all.
    """
    top = cells.get(cell_key(path[0]))
    if top is None:
        return None
    q, rows_above = np.array(top[:3], dtype=float), top[3]
    for cell in path[1:]:
        entry = cells.get(cell_key(cell))
        if entry is None:
            break
        if entry[3] == rows_above:
            continue
        rows_above, sources = entry[3], float(entry[4])
        q = (sources * np.array(entry[:3], dtype=float) + prior_sources * q) / (sources + prior_sources)
    return q


def widening_for(stored: dict, regime: str) -> float:
    return stored["widening_by_phase"].get(PHASE_OF_REGIME[regime], max(stored["widening_by_phase"].values()))


def band(q, widening: float) -> tuple[float, float]:
    """Low and high ratio measured / predicted: the 10th-90th band widened around the median, in log space."""
    low, mid, high = q
    return float(np.exp(mid + widening * (low - mid))), float(np.exp(mid + widening * (high - mid)))


def estimate_regimes(batch: float, under_load: bool, all_at_once: bool = False,
                     single_client: bool = False) -> list[tuple[str, tuple, tuple]]:
    """Which regime's band each interval column of an estimate takes: (regime, speeds, times) triples.

    The columns are judged as validation judges a measurement of them (:func:`measurement_regime`,
    :func:`band_regime`): under a load everything is a serving figure but a single client's decode, which is a
    batch of one; in a run that sends every request at once the latencies are the queue's (serving) and the
    run's output throughput is a max-throughput figure."""
    if under_load and single_client:
        speeds, times = SINGLE_CLIENT_DECODE
        return [("decode_one_client", speeds, times),
                ("serving", tuple(k for k in DECODE[0] + PREFILL[0] if k not in speeds),
                 tuple(k for k in DECODE[1] + PREFILL[1] if k not in times))]
    if under_load:
        return [("serving", DECODE[0] + PREFILL[0], DECODE[1] + PREFILL[1])]
    if all_at_once:
        latency_speeds = tuple(k for k in DECODE[0] if k not in THROUGHPUT_COLUMNS)
        return [("serving", latency_speeds + PREFILL[0], DECODE[1] + PREFILL[1]),
                ("throughput", THROUGHPUT_COLUMNS, ())]
    return [("decode_b1" if batch <= 1 else "decode_batched", *DECODE), ("prefill", *PREFILL)]


def pessimistic_ratios(moe: bool, family: str, engine: str, vendor: str, device_class: str,
                       single_client: bool) -> tuple[float, float]:
    """The pessimistic ends (measured / predicted speed; 1 where there is no band) of the intervals a TTFT and a
    per-user speed under a load fall in: the serving band, but for a single client's speed, which is a batch of
    one's (:func:`band_regime`)."""
    def low(regime: str) -> float:
        found = measurement_band("decode_tps_per_seq", regime, moe, family, engine, vendor, device_class)
        return found[0] if found else 1.0

    return low("serving"), low(band_regime("decode_tps_per_seq", "serving", single_client))


def interval_columns(results: dict, limit: dict, moe: bool, family: str, engine: str, vendor: str,
                     device_class: str, batch: float, under_load: bool, calibrated: bool,
                     all_at_once: bool = False, single_client: bool = False) -> dict:
    """Low/high speeds and times for one estimate's results, capped by ``limit`` (the physical roofline); the
    bands of :func:`estimate_regimes`."""
    stored = _shipped()
    if stored is None:
        return {"interval_basis": "no validation results shipped: no interval"}
    group = GROUP_OF_CLASS[device_class]
    backend = default_backend(vendor, device_class)
    out, bases = {}, []
    for regime, speeds, times in estimate_regimes(batch, under_load, all_at_once, single_client):
        found = shipped_band(stored, regime, moe, family, engine, group, backend)
        formats = f"{family} weights, " if regime in FORMAT_REGIMES else ""
        name = f"{regime} ({CELLS_OF_REGIME[regime]} cells)" if regime in CELLS_OF_REGIME else regime
        bases.append(f"{name}: no held-out rows, no interval" if found is None else
                     f"{name}: {model_type(moe)} models, {formats}{engine} on {group} ({backend or 'any backend'}), "
                     f"shrunk towards its parents, widened {widening_for(stored, regime):g}x")
        if found is None:
            continue
        low, high = found
        for key in speeds:
            if _finite(results.get(key)):
                out[f"{key}_low"] = results[key] * low
                out[f"{key}_high"] = _cap_speed(results[key] * high, limit.get(key))
        for key in times:
            if _finite(results.get(key)):
                out[f"{key}_high"] = results[key] / low
                out[f"{key}_low"] = _cap_time(results[key] / high, limit.get(key))
    kind = ("calibrated device (interval from datasheet-based residuals: likely conservative)" if calibrated
            else "datasheet-based")
    out["interval_basis"] = (f"80% interval from leave-one-source-out residuals ({'; '.join(bases)}; widening "
                             f"chosen on held-out sources); upper speeds capped at the roofline at 100% of "
                             f"datasheet bandwidth and peak; {kind}")
    out["interval_calibrated"] = calibrated
    return out


def row_interval(predicted: float, ratios: tuple[float, float], limit: float, metric: str):
    """A measured metric's 80% interval (low, high, remark) around ``predicted``: its band ``ratios`` capped by
    the physical ``limit`` (no speed above it, no time below), and :func:`band_remark`'s note."""
    low, high = predicted * ratios[0], predicted * ratios[1]
    time = metric in TIME_METRICS
    low, high = (_cap_time(low, limit), high) if time else (low, _cap_speed(high, limit))
    return low, high, band_remark(predicted, low, high, time)


def band_remark(value: float, low: float, high: float, time: bool) -> str:
    """'' when an estimate lies inside its band; else which way held-out runs like it went. A model biased in a
    cell puts its band off the estimate (the band is centred on the held-out residuals' median), and a user
    reading both should know which to trust."""
    if low <= value <= high:
        return ""
    faster = (value > high) == time   # a time above its band, or a speed below it: runs were faster
    return f"held-out runs like this one measured {'faster' if faster else 'slower'} than estimated"


def _finite(value) -> bool:
    return value is not None and bool(np.isfinite(value)) and value > 0


def _cap_speed(high: float, limit) -> float:
    return min(high, limit) if _finite(limit) else high


def _cap_time(low: float, limit) -> float:
    return max(low, limit) if _finite(limit) else low
