"""From raw measurements to the summary a profile carries (see estimator.efficiency.calibration_profile.Summary)."""

from __future__ import annotations

import statistics

from calibrate.benchmarks import ELEMENT_BYTES
from estimator.efficiency.calibration_profile import BandwidthPoint, Summary
from estimator.specs.hardware import Hardware


def _ok(measurements: list[dict], bench: str) -> list[dict]:
    return [m for m in measurements if m.get("bench") == bench and m.get("ok")]


def bandwidth_plateau(points: list[dict], key: str, llc_bytes: float) -> float | None:
    """Median rate over transfers well beyond the last-level cache (the largest third when none are)."""
    rated = sorted((p["size_bytes"], p[key]) for p in points if p.get(key))
    if not rated:
        return None
    beyond = [r for s, r in rated if s >= 4 * llc_bytes] or [r for _, r in rated[-max(1, len(rated) // 3):]]
    return statistics.median(beyond)


def fit_summary(measurements: list[dict], llc_bytes: float, hardware: Hardware | None) -> Summary:
    """Fit the profile summary; efficiencies are given only for a device matched to the database."""
    bw = _ok(measurements, "bandwidth")
    read = bandwidth_plateau(bw, "read_bytes_per_s", llc_bytes)
    if read is None:
        raise ValueError("no bandwidth measurement succeeded: nothing to fit")
    copy = bandwidth_plateau(bw, "copy_bytes_per_s", llc_bytes)
    mm = _ok(measurements, "matmul")
    gemm = {}
    for m in mm:
        if m["m"] == m["n"] == m["k"]:
            gemm[m["dtype"]] = max(gemm.get(m["dtype"], 0.0), m["flops_per_s"])
    gemv = {}
    for m in mm:
        if m["m"] == 1:
            gemv[m["dtype"]] = max(gemv.get(m["dtype"], 0.0), m["bytes_per_s"])
    # skinny GEMMs turn compute-bound where 2·M FLOPs per weight element meet the measured ridge
    ridge = {d: ELEMENT_BYTES[d] * gemm[d] / (2 * gemv[d]) for d in gemm if d in gemv}
    # the decode curve: weight bytes per second at each row count, the best skinny shape
    stream: dict[str, dict[int, float]] = {}
    for m in mm:
        if not m["m"] == m["n"] == m["k"]:
            rate = m["n"] * m["k"] * ELEMENT_BYTES[m["dtype"]] / m["median_s"]
            rows = stream.setdefault(m["dtype"], {})
            rows[m["m"]] = max(rows.get(m["m"], 0.0), rate)
    attention = [m["flops_per_s"] for m in _ok(measurements, "attention")]
    summary = {
        "read_bandwidth_bytes_per_s": read,
        "copy_bandwidth_bytes_per_s": copy,
        "bandwidth_curve": [BandwidthPoint(size_bytes=p["size_bytes"], read_bytes_per_s=p.get("read_bytes_per_s"),
                                           copy_bytes_per_s=p.get("copy_bytes_per_s"))
                            for p in sorted(bw, key=lambda p: p["size_bytes"])],
        "gemm_flops_per_s": gemm, "gemv_bytes_per_s": gemv, "ridge_batch": ridge, "weight_stream_bytes_per_s": stream,
        "model_weight_stream_bytes_per_s": model_stream(measurements),
        "attention_flops_per_s": max(attention) if attention else None,
        "launch_overhead_s": _first(measurements, "launch", "per_op_s"),
        "small_op_chain_s_per_op": _first(measurements, "small_op_chain", "per_op_s"),
        "sync_overhead_s": _first(measurements, "sync", "per_sync_s"),
        "eager_layer_s": _positive(_first(measurements, "eager_host", "per_layer_s")),
        "eager_expert_s": _positive(_first(measurements, "eager_host", "per_expert_s")),
        "kv_expand_bytes_per_s": _first(measurements, "kv_expand", "bytes_per_s"),
        "host_to_device_bytes_per_s": _host(measurements, to_device=True),
        "device_to_host_bytes_per_s": _host(measurements, to_device=False),
    }
    if hardware is not None:
        summary["bandwidth_efficiency"] = read / hardware.memory_bandwidth_bytes_per_s
        summary["compute_efficiency"] = {d: rate / hardware.peak_flops_per_s(d) for d, rate in gemm.items()
                                         if hardware.peak_flops_per_s(d)}
    return Summary(**summary)


def model_stream(measurements: list[dict]) -> dict[str, dict[str, dict[int, float]]]:
    """Each timed model's decode curve, per dtype and M: all its matrices' weight bytes over the time they take
    together, Σ count·N·K·bytes / Σ count·t (the rate its whole step streams at); an M where one matrix failed
    has no point."""
    timed: dict[tuple[str, str, int], list[dict]] = {}
    for m in measurements:
        if m.get("bench") == "model_matmul":
            timed.setdefault((m["model"], m["dtype"], m["m"]), []).append(m)
    out: dict[str, dict[str, dict[int, float]]] = {}
    for (model, dtype, rows), matrices in sorted(timed.items()):
        if all(m.get("ok") for m in matrices):
            moved = sum(m["count"] * m["n"] * m["k"] * ELEMENT_BYTES[dtype] for m in matrices)
            out.setdefault(model, {}).setdefault(dtype, {})[rows] = moved / sum(m["count"] * m["median_s"]
                                                                                 for m in matrices)
    return out


def _first(measurements: list[dict], bench: str, key: str) -> float | None:
    found = _ok(measurements, bench)
    return found[0][key] if found else None


def _positive(value: float | None) -> float | None:
    """A difference of two timings, kept only when the noise left it positive."""
    return value if value is not None and value > 0 else None


def _host(measurements: list[dict], to_device: bool) -> dict[str, float]:
    return {("pinned" if m["pinned"] else "pageable"): m["bytes_per_s"]
            for m in _ok(measurements, "host_transfer") if m["to_device"] == to_device}
