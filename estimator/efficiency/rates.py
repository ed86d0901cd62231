"""The rates a pass runs at: datasheet peaks × the device's efficiency × the engine's (docs/architecture.md).

Pure functions of the hardware, format and engine columns; the pass times in :mod:`estimator.physics.roofline`
divide the ledgers by them.
"""

from __future__ import annotations

import numpy as np

from estimator.efficiency.defaults import EngineDefaults, bandwidth_scale_of_groups, compute_eff_by_class

# PyTorch's copy of a strided cache slice out to one head per query head (repeat_interleave, or expand and
# reshape) is a generic elementwise kernel whose per-element index arithmetic, not the memory, bounds it on a
# fast-memory device: the H200's calibration measured 1.23 TB/s of the 4.21 TB/s a plain copy reaches, that is
# 0.0183 bytes per FP32 FLOP of its 67 TFLOPS. A device without a measurement of its own copies at that many
# bytes per FP32 FLOP, or at its memory's rate where that is lower (an RTX 4090: 1.5 TB/s of index arithmetic,
# so its 1,008 GB/s memory binds; docs/formulas.md §13).
KV_EXPAND_BYTES_PER_FP32_FLOP = 1.229e12 / 67e12


def effective_rates(hw, f, peak_linear_flops_per_s, engine: EngineDefaults):
    """Datasheet peaks × device × engine efficiency (docs/architecture.md); FP4 GEMMs where hw["fp4_gemm"] is 1."""
    # PyTorch's own GEMMs (torch_kernels) run at a calibration's measured GEMM rate, with no engine factor on top
    own = engine.torch_kernels & (np.asarray(hw.get("calibrated_gemm", 0.0)) > 0)
    compute_eff = hw["device_compute_eff"] * np.where(own, 1.0, compute_eff_by_class(engine)[hw["device_class_code"]])
    attention_eff = compute_eff
    if engine.fp16_accumulate:   # GeForce: twice the listed FP32-accumulate tensor rate (compute_ceiling)
        speedup = hw["fp16_accumulate_speedup"]
        compute_eff = compute_eff * speedup
        # attention's FP32-accumulating share runs at the listed rate: the shares' times add
        share = engine.attention_fp16_accumulate_share
        attention_eff = attention_eff / (1 - share + share / speedup)
    bandwidth = hw["bandwidth_bytes_per_s"] * hw["device_bandwidth_eff"]
    # the weight stream's engine factor is its memory's group's (bandwidth_group), the compute's its market's
    group = hw["bandwidth_group_code"]
    native = bandwidth_scale_of_groups(engine)[group]
    weight_scale = np.where(f["dequantizes"], bandwidth_scale_of_groups(engine, True)[group], native)
    weight_engine_factor = weight_scale * f["engine_bandwidth_eff"]
    fp4_share = np.where(np.asarray(hw.get("fp4_gemm", 0.0)) > 0, engine.fp4_compute_scale, 1.0)  # FP4 GEMMs' own
    # the weight stream's datasheet share before any bound per SM; multiplied in the order the fitted profiles were
    # made with (bandwidth * weight_engine_factor rounds differently and moves a row across a floor()ed batch)
    weight_share = bandwidth * weight_scale * f["engine_bandwidth_eff"]
    weight_bytes_per_s = bounded_weight_stream(weight_share, hw, f, engine)
    return {
        "linear_flops_per_s": peak_linear_flops_per_s * compute_eff * fp4_share,
        "attention_flops_per_s": hw["attention_flops_per_s"] * attention_eff,
        # a vector decode-attention kernel's FLOPs run on the FP32 lanes (vector_decode_attention); NaN: no FP32 peak
        "vector_attention_flops_per_s": np.asarray(hw.get("fp32_flops_per_s", np.nan), dtype=float)
        * engine.vector_attention_eff,
        "weight_bytes_per_s": weight_bytes_per_s,
        # the stream where the engine's bound per SM holds it below its datasheet share, else NaN: the bound line
        # names it
        "weights_per_sm_bound_bytes_per_s": np.where(weight_bytes_per_s < PER_SM_NAMED_BELOW * weight_share,
                                                     weight_bytes_per_s, np.nan),
        "weight_engine_factor": weight_engine_factor,   # the engine's share of the device's weight stream
        "stream_bytes_per_s": bandwidth,   # contiguous elementwise kernels: the device's own rate
        # the attention kernels' own share of the device's bandwidth, not the weight kernels' group factor
        "kv_bytes_per_s": bandwidth * engine.kv_bandwidth_eff,
        # the cache copied before attention: a copy kernel with no engine factor, at a calibration's measured rate,
        # else the lower of its index arithmetic's on the FP32 units and the memory's (no FP32 peak: the memory's)
        "kv_expand_bytes_per_s": np.where(np.isfinite(kv_expand := hw.get("kv_expand_bytes_per_s", np.nan)),
                                          kv_expand, np.fmin(bandwidth, KV_EXPAND_BYTES_PER_FP32_FLOP
                                                             * hw.get("fp32_flops_per_s", np.nan))),
    }


# Sharpness of the corner between the two limits of per_sm_bounded: at 8 the rate is within 0.3% of the lower
# limit once the two differ by 1.6x, yet a fit sees the bound's pull on both sides of the corner.
PER_SM_CORNER = 8.0
# The bound is named where it holds the stream 5% or more below its share: the rounded corner alone takes up to 8.3%
# off a stream at the bound's own rate, but under 0.3% once the two differ by 1.6x.
PER_SM_NAMED_BELOW = 0.95


def per_sm_bounded(stream_bytes_per_s, sms, bytes_per_s_per_sm):
    """A weight stream whose kernels keep a bounded number of bytes in flight per SM: by Little's law it reads at
    most ``bytes_per_s_per_sm`` a second on each of the device's ``sms``, whatever the datasheet allows
    (docs/formulas.md §9). The lower of the two, its corner rounded, (a⁻ᵖ + b⁻ᵖ)^(−1/p) with p = PER_SM_CORNER;
    no bound where the engine has none or the device's SM count is not recorded (NaN)."""
    if bytes_per_s_per_sm is None:
        return stream_bytes_per_s
    sms = np.asarray(sms, dtype=float)
    cap = np.where(np.isfinite(sms), sms * bytes_per_s_per_sm, np.inf)
    return (stream_bytes_per_s ** -PER_SM_CORNER + cap ** -PER_SM_CORNER) ** (-1 / PER_SM_CORNER)


def bounded_weight_stream(stream_bytes_per_s, hw, f, engine: EngineDefaults):
    """A weight stream with the engine's bound per SM where its kernel has one: 16-bit weights only, dequantizing
    kernels are not bounded (:func:`per_sm_bounded`)."""
    return np.where(f["dequantizes"], stream_bytes_per_s, per_sm_bounded(
        stream_bytes_per_s, hw.get("streaming_multiprocessors", np.nan), engine.native_bytes_per_s_per_sm))


def with_vector_attention(rates: dict, vector) -> dict:
    """``rates`` for a pass whose attention, where ``vector``, is the engine's vector decode kernel
    (EngineDefaults.vector_decode): its FLOPs at that kernel's share of the FP32 peak, the matrix rate elsewhere and
    on a device that lists no FP32 peak (docs/formulas.md §13)."""
    use = np.asarray(vector, dtype=bool) & np.isfinite(rates["vector_attention_flops_per_s"])
    if not np.any(use):
        return rates
    return {**rates, "attention_flops_per_s": np.where(use, rates["vector_attention_flops_per_s"],
                                                       rates["attention_flops_per_s"])}
