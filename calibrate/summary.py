"""Readable summaries of calibration profiles: measured against the datasheet, and two profiles side by side."""

from __future__ import annotations

from estimator.efficiency.calibration_profile import CalibrationProfile
from estimator.formatting import seconds, table
from estimator.specs.hardware import Hardware
from estimator.units import GB, TFLOPS


def _rate(value: float | None, unit: str, scale: float) -> str:
    return "-" if value is None else f"{value / scale:,.2f} {unit}"


def _versus(measured: float | None, datasheet: float | None, unit: str, scale: float) -> tuple[str, str, str]:
    share = "" if not (measured and datasheet) else f"{measured / datasheet:.0%}"
    return _rate(measured, unit, scale), _rate(datasheet, unit, scale), share


def format_profile(profile: CalibrationProfile, hardware: Hardware | None) -> str:
    """Measured vs datasheet, e.g. "read bandwidth 4.31 TB/s vs 4.80 TB/s: 90%"."""
    s = profile.summary
    peak = (lambda d: hardware.peak_flops_per_s(d)) if hardware else (lambda d: None)
    rows = [("read bandwidth (plateau)", *_versus(s.read_bandwidth_bytes_per_s,
                                                hardware.memory_bandwidth_bytes_per_s if hardware else None,
                                                "GB/s", GB)),
            ("copy bandwidth (read + write)", *_versus(s.copy_bandwidth_bytes_per_s, None, "GB/s", GB))]
    rows += [(f"{d} GEMM", *_versus(v, peak(d), "TFLOPS", TFLOPS)) for d, v in s.gemm_flops_per_s.items()]
    rows += [(f"{d} GEMV weight stream (M=1)", *_versus(v, None, "GB/s", GB)) for d, v in s.gemv_bytes_per_s.items()]
    rows += [(f"{d} skinny-GEMM ridge", f"M = {v:,.1f}", "", "") for d, v in s.ridge_batch.items()]
    rows += [(f"{d} weight stream (M={m})", _rate(r, "GB/s", GB), "", "")   # the decode curve beyond M=1
             for d, curve in s.weight_stream_bytes_per_s.items() for m, r in sorted(curve.items()) if m > 1]
    rows += [(f"{model} {d} weight stream (M={m})", _rate(r, "GB/s", GB), "", "")   # a timed model's own curve
             for model, by_dtype in s.model_weight_stream_bytes_per_s.items() for d, curve in by_dtype.items()
             for m, r in sorted(curve.items())]
    if s.attention_flops_per_s:
        rows.append(("fused attention (SDPA)", _rate(s.attention_flops_per_s, "TFLOPS", TFLOPS), "", ""))
    if s.kv_expand_bytes_per_s:
        rows.append(("grouped KV expanded (read + write)", _rate(s.kv_expand_bytes_per_s, "GB/s", GB), "", ""))
    for label, value in (("kernel launch", s.launch_overhead_s), ("small op in a chain", s.small_op_chain_s_per_op),
                         ("device synchronize", s.sync_overhead_s), ("eager decoder layer (host)", s.eager_layer_s),
                         ("eager routed expert (host)", s.eager_expert_s)):
        if value:
            rows.append((label, seconds(value), "", ""))
    for direction, rates in (("host -> device", s.host_to_device_bytes_per_s),
                             ("device -> host", s.device_to_host_bytes_per_s)):
        rows += [(f"{direction} ({kind})", _rate(v, "GB/s", GB), "", "") for kind, v in rates.items()]
    failed = [m for m in profile.measurements if not m.get("ok")]
    match = f"matched to {hardware.name}" if hardware else "not in the hardware database: no datasheet to compare"
    lines = [f"Calibration of {profile.label}; {match}",
             table(rows, header=("", "measured", "datasheet", "share"))]
    if failed:
        lines.append(f"  {len(failed)} measurement(s) skipped: " + "; ".join(
            sorted({f"{m['bench']} {m.get('dtype', '')}: {m.get('skipped') or m['error'].split(':')[0]}"
                    .replace("  ", " ") for m in failed})))
    if not profile.complete:
        lines.append("  interrupted: the profile holds only what was measured before the stop")
    return "\n".join(lines)


def compare(a: CalibrationProfile, b: CalibrationProfile) -> str:
    """Two profiles side by side, with the ratio B / A."""
    def pairs():
        sa, sb = a.summary, b.summary
        yield "read bandwidth", sa.read_bandwidth_bytes_per_s, sb.read_bandwidth_bytes_per_s, "GB/s", GB
        yield "copy bandwidth", sa.copy_bandwidth_bytes_per_s, sb.copy_bandwidth_bytes_per_s, "GB/s", GB
        for d in sorted(set(sa.gemm_flops_per_s) | set(sb.gemm_flops_per_s)):
            yield f"{d} GEMM", sa.gemm_flops_per_s.get(d), sb.gemm_flops_per_s.get(d), "TFLOPS", TFLOPS
        yield "kernel launch", sa.launch_overhead_s, sb.launch_overhead_s, "us", 1e-6
    rows = [(label, _rate(x, unit, scale), _rate(y, unit, scale), f"{y / x:.2f}x" if x and y else "")
            for label, x, y, unit, scale in pairs()]
    return "\n".join([f"A: {a.label}", f"B: {b.label}", table(rows, header=("", "A", "B", "B / A"))])
