"""Prediction intervals grounded in measured error.

``roofline validate --published --write`` stores, per engine, phase (decode or
prefill) and device group, the range of held-out ratios measured / predicted
speed that covers 80% of rows from sources the fit never saw
(:mod:`estimator.validation.published`). An estimate multiplies its speeds by that range.
"""

from __future__ import annotations

from estimator.efficiency.defaults import GROUP_OF_CLASS
from estimator.efficiency.engine_profiles import load_intervals


def interval_for(table: dict, engine: str, phase: str, group: str):
    """The most specific interval available: engine and group, engine, then all engines; with its basis."""
    entry = table.get(engine, {}).get(phase, {})
    for key, label in ((group, f"{engine} on {group} devices"), ("all", f"{engine}, all devices")):
        if entry.get(key):
            return entry[key], label
    return table["global"].get(phase), "all engines"


def interval_columns(results: dict, engine: str, device_class: str, calibrated: bool) -> dict:
    """Low/high speeds and times for one estimate's results, and what they rest on."""
    stored = load_intervals()
    if stored is None:
        return {"interval_basis": "no validation results shipped: no interval"}
    group = GROUP_OF_CLASS[device_class]
    out = {}
    bases = []
    for phase, speeds, times in (("decode", ("decode_tps_per_seq", "decode_tps_total"), ("itl_s",)),
                                 ("prefill", ("prefill_tps",), ("ttft_s",))):
        found, basis = interval_for(stored["intervals"], engine, phase, group)
        if not found:
            continue
        low, high, rows = found
        bases.append(f"{phase}: {basis}, {rows} held-out rows")
        for key in speeds:
            if results.get(key) is not None:
                out[f"{key}_low"], out[f"{key}_high"] = results[key] * low, results[key] * high
        for key in times:
            if results.get(key) is not None:
                out[f"{key}_low"], out[f"{key}_high"] = results[key] / high, results[key] / low
    kind = ("calibrated device (interval from datasheet-based residuals: likely conservative)" if calibrated
            else "datasheet-based")
    out["interval_basis"] = (f"80% interval from leave-one-source-out residuals ({'; '.join(bases)}; widened "
                             f"{stored['widening']:g}x to reach {stored['out_of_source_coverage']:.0%} "
                             f"out-of-source coverage); {kind}")
    out["interval_calibrated"] = calibrated
    return out
