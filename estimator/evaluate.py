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
from estimator.kvcache import PAGED_BLOCK_TOKENS
from estimator.memory import memory_fit
from estimator.parallel import micro_batches, pipeline_transfer_time, stage_communication_time
from estimator.roofline import bound_of, pass_time
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


def _phase(stage: dict, passes, per_step_s, transfer_s) -> dict:
    """A phase made of ``passes`` stage passes, plus the per-step overhead and pipeline transfers."""
    out = {k: v * passes for k, v in stage.items() if k.endswith("_s")}
    out["overhead_s"] = out["overhead_s"] + per_step_s
    out["communication_s"] = out["communication_s"] + transfer_s
    out["time_s"] = out["time_s"] + per_step_s + transfer_s
    out["bound"] = bound_of(out["compute_s"], out["memory_s"], out["linear_s"] + out["attention_s"],
                            out["communication_s"], out["overhead_s"])
    return out


DEFAULT_SERVING = {"paged": True, "block_tokens": PAGED_BLOCK_TOKENS, "prefix_tokens": 0, "fused_attention": True}


def evaluate(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving=None,
             engine: EngineDefaults = GENERIC_ENGINE) -> dict[str, np.ndarray]:
    """Prefill, decode and memory for every configuration the inputs broadcast to.

    Parameters
    ----------
    m, hw, f, kv : dict
        Model, hardware, weight-format and KV-format columns (:mod:`estimator.columns`).
    peak_linear_flops_per_s : array
        Dense peak of the weight format's compute dtype on the device.
    B, T, O : array
        Concurrent sequences (over all replicas), prompt tokens, output tokens.
    layout : dict
        ``tp``, ``pp``, ``ep``, ``dp`` arrays (:mod:`estimator.parallel`).
    serving : dict
        ``paged`` KV allocation, ``block_tokens``, cached ``prefix_tokens`` per prompt,
        ``fused_attention`` (:data:`DEFAULT_SERVING` when omitted).

    Notes
    -----
    Each replica decodes B/dp sequences in m = min(B/dp, pp) micro-batches. One
    pipeline-stage pass costs the roofline time of the micro-batch's ledgers
    divided over the replica's tp·pp devices, plus its collectives and per-layer
    overheads; a decode cycle takes max(m, pp) stage passes and prefill
    m + pp − 1, plus the per-step overhead and the stage-to-stage transfers.
    """
    B, T, O = (np.asarray(a, dtype=float) for a in (B, T, O))
    tp, pp, ep, dp = (np.asarray(layout[k], dtype=float) for k in ("tp", "pp", "ep", "dp"))
    serving = {**DEFAULT_SERVING, **(serving or {})}
    fused_attention, cached = serving["fused_attention"], np.asarray(serving["prefix_tokens"], dtype=float)
    kv_bits = kv["kv_bits"]
    rates = effective_rates(hw, f, peak_linear_flops_per_s, engine)
    latency_s = engine.allreduce_latency_s
    replica_devices = tp * pp
    replica_batch = B / dp
    micro = micro_batches(replica_batch, pp)
    b = replica_batch / micro                                 # sequences per micro-batch
    stage_overhead_s = m["layers"] / pp * engine.per_layer_s

    new_tokens = b * (T - cached)
    prefill_flops = fl.prefill_flops(m, b, T, cached)
    prefill_bytes = tr.prefill_bytes(m, f, kv_bits, b, T, tp, fused_attention, cached)
    prefill_stage = pass_time(prefill_flops, prefill_bytes, rates, replica_devices, stage_overhead_s,
                              stage_communication_time(m, hw, new_tokens, tp, pp, ep, latency_s))
    prefill = _phase(prefill_stage, micro + pp - 1, engine.per_step_s,
                     pipeline_transfer_time(m, hw, new_tokens, pp, latency_s))
    ttft_s = np.where(T > 0, prefill["time_s"], 0.0)

    lo, hi, steps = decode_context_range(T, O)
    span_global, span_local = mean_span(lo, hi, 0), mean_span(lo, hi, m["window"])
    decode_flops = fl.decode_flops(m, b, span_global, span_local)
    decode_bytes = tr.decode_bytes(m, f, kv_bits, b, span_global, span_local, tp, fused_attention)
    decode_stage = pass_time(decode_flops, decode_bytes, rates, replica_devices, stage_overhead_s,
                             stage_communication_time(m, hw, b, tp, pp, ep, latency_s))
    decode = _phase(decode_stage, np.maximum(micro, pp), engine.per_step_s,
                    pipeline_transfer_time(m, hw, b, pp, latency_s))
    itl_s = decode["time_s"]
    e2e_s = ttft_s + steps * itl_s

    matmul_flops_per_token = 2 * (fl.matmul_params_per_token(m) + m["params_head"])
    out = {
        "ttft_s": ttft_s,
        "micro_batches": micro,
        "prefill_tps": B * (T - cached) / np.where(ttft_s > 0, ttft_s, 1.0),
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
        "critical_batch": tr.weight_bytes_streamed(m, f, b) * rates["linear_flops_per_s"]
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
    out.update(memory_fit(m, f, kv_bits, hw, replica_batch, T, O, tp, pp, serving))
    out["max_batch"] = out["max_batch"] * dp
    out["max_concurrency"] = out["max_batch"]
    out["kv_cache_bytes_per_token"] = tr.kv_bytes_per_token_layer(m, kv_bits) * m["layers"] + 0 * B
    return out
