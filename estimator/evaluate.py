"""The one code path: columns in, a table of results out.

:func:`evaluate` takes column dicts whose arrays broadcast against each other
(one entry for a single estimate, orthogonal axes for a sweep, gathered rows for
a CSV of configurations) and returns a dict of result arrays of the broadcast
shape. It knows nothing of YAML or printing.
"""

from __future__ import annotations

import numpy as np

from estimator import flops as fl
from estimator import traffic as tr
from estimator.efficiency import GENERIC_ENGINE, EngineDefaults
from estimator.memory import memory_fit
from estimator.roofline import allreduce_time, pass_time
from estimator.span import decode_context_range, mean_span


def effective_rates(hw, f, peak_linear_flops_per_s, engine: EngineDefaults):
    """Datasheet peaks × device efficiency × engine efficiency (ARCHITECTURE.md)."""
    compute_eff = hw["device_compute_eff"] * engine.compute_eff
    bandwidth = hw["bandwidth_bytes_per_s"] * hw["device_bandwidth_eff"]
    return {
        "linear_flops_per_s": peak_linear_flops_per_s * compute_eff,
        "attention_flops_per_s": hw["attention_flops_per_s"] * compute_eff,
        "weight_bytes_per_s": bandwidth * f["engine_bandwidth_eff"],
        "kv_bytes_per_s": bandwidth * engine.kv_bandwidth_eff,
    }


def tensor_parallel_time(m, hw, tokens, n_gpus, engine: EngineDefaults):
    """Two all-reduces per layer (after attention and after the MLP) of tokens × d activations (Megatron)."""
    message_bytes = tokens * m["hidden"] * tr.ACTIVATION_BYTES
    return 2 * m["layers"] * allreduce_time(message_bytes, n_gpus, hw["link_bytes_per_s"], engine.allreduce_latency_s)


def evaluate(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, n_gpus, fused_attention=True,
             engine: EngineDefaults = GENERIC_ENGINE) -> dict[str, np.ndarray]:
    """Prefill, decode and memory for every configuration the inputs broadcast to.

    Parameters
    ----------
    m, hw, f, kv : dict
        Model, hardware, weight-format and KV-format columns (:mod:`estimator.columns`).
    peak_linear_flops_per_s : array
        Dense peak of the weight format's compute dtype on the device.
    B, T, O, n_gpus : array
        Concurrent sequences, prompt tokens, output tokens, tensor-parallel devices.
    """
    B, T, O, n_gpus = (np.asarray(a, dtype=float) for a in (B, T, O, n_gpus))
    kv_bits = kv["kv_bits"]
    rates = effective_rates(hw, f, peak_linear_flops_per_s, engine)
    overheads = {"per_step_s": engine.per_step_s, "per_layer_s": engine.per_layer_s}

    prefill_flops = fl.prefill_flops(m, B, T)
    prefill_bytes = tr.prefill_bytes(m, f, kv_bits, B, T, n_gpus, fused_attention)
    prefill = pass_time(prefill_flops, prefill_bytes, rates, n_gpus, m["layers"], overheads,
                        tensor_parallel_time(m, hw, B * T, n_gpus, engine))
    ttft_s = np.where(T > 0, prefill["time_s"], 0.0)

    lo, hi, steps = decode_context_range(T, O)
    span_global, span_local = mean_span(lo, hi, 0), mean_span(lo, hi, m["window"])
    decode_flops = fl.decode_flops(m, B, span_global, span_local)
    decode_bytes = tr.decode_bytes(m, f, kv_bits, B, span_global, span_local, n_gpus, fused_attention)
    decode = pass_time(decode_flops, decode_bytes, rates, n_gpus, m["layers"], overheads,
                       tensor_parallel_time(m, hw, B, n_gpus, engine))
    itl_s = decode["time_s"]
    e2e_s = ttft_s + steps * itl_s

    matmul_flops_per_token = 2 * (fl.matmul_params_per_token(m) + m["params_head"])
    out = {
        "ttft_s": ttft_s,
        "prefill_tps": B * T / np.where(ttft_s > 0, ttft_s, 1.0),
        "itl_s": itl_s,
        "decode_tps_per_seq": 1.0 / itl_s,
        "decode_tps_total": B / itl_s,
        "e2e_latency_s": e2e_s,
        "tpot_inclusive_s": e2e_s / O,
        "throughput_out_tps": B * O / e2e_s,
        "prefill_bound": prefill["bound"],
        "decode_bound": decode["bound"],
        "prefill_intensity_flops_per_byte": fl.total(prefill_flops) / sum(prefill_bytes.values()),
        "decode_intensity_flops_per_byte": fl.total(decode_flops) / sum(decode_bytes.values()),
        "ridge_flops_per_byte": peak_linear_flops_per_s / hw["bandwidth_bytes_per_s"],
        # batch at which the decode matmuls' compute time reaches their weight-streaming time
        "critical_batch": tr.weight_bytes_streamed(m, f, B) * rates["linear_flops_per_s"]
        / (matmul_flops_per_token * rates["weight_bytes_per_s"]),
        "decode_steps": steps,
        "mean_decode_context": span_global,
    }
    for phase, times in (("prefill", prefill), ("decode", decode)):
        for key in ("linear_s", "attention_s", "communication_s", "overhead_s", "compute_s", "memory_s"):
            out[f"{phase}_{key}"] = times[key]
    for name, ledger in (("prefill_flops", prefill_flops), ("prefill_bytes", prefill_bytes),
                         ("decode_flops", decode_flops), ("decode_bytes", decode_bytes)):
        for term, value in ledger.items():
            out[f"{name}_{term}"] = value
        out[f"{name}_total"] = sum(ledger.values())
    out.update(memory_fit(m, f, kv_bits, hw, B, T, O, n_gpus, fused_attention))
    return out
