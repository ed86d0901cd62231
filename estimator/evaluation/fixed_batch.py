"""Prefill, decode and memory at a fixed batch: columns in, result columns out.

:func:`results_at_batch` takes column dicts whose arrays broadcast against each
other (one entry for a single estimate, orthogonal axes for a sweep, gathered rows
for a CSV of configurations) and returns a dict of result arrays of the broadcast
shape. It knows nothing of YAML or printing; :mod:`estimator.evaluation.compute`
adds the steady state under a load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from estimator.efficiency.calibration_profile import weight_stream_eff_at
from estimator.efficiency.defaults import GENERIC_ENGINE, EngineDefaults, memory_budget
from estimator.efficiency.rates import bounded_weight_stream, effective_rates, with_vector_attention
from estimator.errors import ConfigurationError
from estimator.evaluation.columns import WEIGHT_STREAM_KEYS
from estimator.evaluation.speeds import phase_speeds
from estimator.physics import flops as fl
from estimator.physics import traffic as tr
from estimator.physics.expert_skew import busiest_rank, distinct_experts
from estimator.physics.expert_tiles import pass_tile_padding
from estimator.physics.host_time import eager_prefill_time, host_costs, overlaps_device, pass_host_time
from estimator.physics.kv_tiers import DISK, DISK_READ_BYTES_PER_S, tier_load_time
from estimator.physics.kvcache import PAGED_BLOCK_TOKENS
from estimator.physics.memory import kv_cache_bytes_per_sequence, memory_fit, sampler_warmup_bytes
from estimator.physics.offload import (
    DEFAULT_UBATCH_TOKENS,
    HOST_LINK_EFFICIENCY,
    LAYERS,
    NONE,
    cpu_expert_bytes_stored,
    cpu_expert_ledgers,
    cpu_moe_layers,
    cpu_moe_time,
    device_weight_share,
    streaming_time,
)
from estimator.physics.parallel import (
    DEFAULT_NETWORK_BYTES_PER_S,
    DEFAULT_NODE_DEVICES,
    micro_batches,
    pipeline_transfer_time,
    pp_link_bytes_per_s,
    stage_communication_time,
    tp_link_bytes_per_s,
)
from estimator.physics.roofline import bound_of, pass_time
from estimator.physics.span import decode_context_range, mean_span
from estimator.physics.speculative import expected_tokens

DEFAULT_SERVING = {"paged": True, "block_tokens": PAGED_BLOCK_TOKENS, "prefix_tokens": 0, "fused_attention": True,
                   "offload": NONE, "gpu_layers": 0, "cpu_moe": 0.0,
                   "ubatch_tokens": DEFAULT_UBATCH_TOKENS, "spec_tokens": 0, "acceptance": 0.0, "draft_cost": 0.0,
                   "concurrency": 0.0, "rate": 0.0, "chunk_tokens": 0.0, "max_num_seqs": np.inf, "prefix_hit_rate": 0.0,
                   "length_mix": None, "expert_skew": 0.0, "kv_tier": 0, "kv_tier_bytes": 0.0,
                   "num_requests": 0.0, "profiled_sequences": np.inf}
PARTS = ("linear_s", "attention_s", "communication_s", "offload_s", "overhead_s", "compute_s", "memory_s")


@dataclass
class _Setup:
    """What every pass of one evaluation shares."""

    m: dict
    hw: dict
    f: dict
    kv_bits: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    serving: dict
    engine: EngineDefaults
    rates: dict
    host_rates: dict | None
    device_share: np.ndarray   # of the weights; the rest is offloaded
    cpu_layers: np.ndarray     # MoE layers whose routed experts are in host memory (llama.cpp --n-cpu-moe)
    tp_link: np.ndarray        # bytes/s the TP collectives run at
    pp_link: np.ndarray        # bytes/s between pipeline stages
    attention_dp: np.ndarray   # 1: attention runs data-parallel over the tp ranks (docs/formulas.md §8)
    # how the engine's attention treats the kernel asked for (docs/formulas.md §13): whether it runs fused, whether
    # its scores stay on chip, whether it copies grouped KV heads out or broadcasts them (reading them g times), and
    # the bits of the cache it reads
    fused_attention: np.ndarray
    scores_on_chip: np.ndarray
    expands_kv: np.ndarray
    broadcasts_kv: np.ndarray
    attended_bits: np.ndarray
    chunk_tokens: np.ndarray   # the most prompt tokens one pass takes (the engine's chunk or micro-batch)


def _skewed(s: _Setup, flops: dict, bytes_: dict, tokens) -> tuple[dict, dict]:
    """Ledgers under skewed routing (:mod:`estimator.physics.expert_skew`): the replica reads fewer distinct
    experts; its FLOPs are unchanged."""
    m = s.m
    fewer = distinct_experts(m["experts"], m["experts_per_token"], tokens, s.serving["expert_skew"]) \
        - tr.expected_experts(m["experts"], m["experts_per_token"], tokens)
    one_expert_bytes = m["moe_layers"] * m["params_routed_one"] * s.f["expert_bits"] / 8
    return flops, {**bytes_, "weights": bytes_["weights"] + fewer * one_expert_bytes}


def _busiest_rank(s: _Setup, flops: dict, bytes_: dict, tokens) -> tuple[dict, dict]:
    """Under expert parallelism with skew, the busiest rank's expert FLOPs and bytes, counted ×ep as a replica
    total (the pass divides by the devices): every MoE layer waits for it."""
    m, skew, ep = s.m, s.serving["expert_skew"], s.ep
    share, busiest = busiest_rank(m["experts"], m["experts_per_token"], tokens, skew, ep)
    spread = distinct_experts(m["experts"], m["experts_per_token"], tokens, skew)
    one_expert_bytes = m["moe_layers"] * m["params_routed_one"] * s.f["expert_bits"] / 8
    expert_flops = 2 * m["params_routed_one"] * m["experts_per_token"] * m["moe_layers"] * tokens
    uneven = (ep > 1) & (m["moe_layers"] > 0)
    linear = flops["linear"] + np.where(uneven, expert_flops * (share * ep - 1), 0.0)
    weights = bytes_["weights"] + np.where(uneven, (busiest * ep - spread) * one_expert_bytes, 0.0)
    return {**flops, "linear": linear}, {**bytes_, "weights": weights}


def _expert_kernels(s: _Setup, flops: dict, tokens) -> dict:
    """MoE grouped GEMMs run each touched expert over few tokens (M_e = tokens · k / experts touched): each costs the
    FLOPs of ``expert_tile_tokens`` more tokens (routing, permutation; docs/formulas.md §9) plus, where the tile width
    follows the pass (``expert_tile_max_tokens``), its quantized tile's padding; none up to ``expert_matvec_tokens``."""
    m, on_device = s.m, np.maximum(s.m["moe_layers"] - s.cpu_layers, 0.0)
    # an engine that runs a prompt in micro-batches (llama.cpp's n_ubatch) touches the experts once per micro-batch
    chunks = np.ceil(tokens / s.serving["ubatch_tokens"]) if s.engine.prefill_in_ubatches else 1.0
    pass_tokens = tokens / chunks
    one_pass = distinct_experts(m["experts"], m["experts_per_token"], pass_tokens, s.serving["expert_skew"])
    tile_padding = 0.0 if not s.engine.expert_tile_max_tokens else np.where(s.f["dequantizes"], pass_tile_padding(
        pass_tokens, m["experts_per_token"], one_pass, s.engine.expert_tile_max_tokens), 0.0)
    pad = (s.engine.expert_tile_tokens + tile_padding) * (np.asarray(tokens) > s.engine.expert_matvec_tokens)
    return {**flops, "linear": flops["linear"] + 2 * m["params_routed_one"] * on_device * chunks * one_pass * pad}


def _pass_rates(s: _Setup, tokens, vector_attention=False) -> dict:
    """The device rates for a pass of ``tokens`` rows: on a calibrated device whose profile measured the decode
    curve, weights stream at its rate for that many rows (docs/formulas.md §13) instead of the read plateau;
    attention at the vector kernel's where ``vector_attention`` (:func:`with_vector_attention`)."""
    rates = with_vector_attention(s.rates, vector_attention)
    if WEIGHT_STREAM_KEYS[0] not in s.hw:
        return rates
    eff = weight_stream_eff_at([s.hw[k] for k in WEIGHT_STREAM_KEYS], tokens)
    curve = np.isfinite(eff)
    # PyTorch's own GEMMs stream at the measured rate; another engine's keep their factor and bound per SM on top
    engine_factor = 1.0 if s.engine.torch_kernels else s.rates["weight_engine_factor"]
    measured = bounded_weight_stream(s.hw["bandwidth_bytes_per_s"] * np.where(curve, eff, 1.0) * engine_factor,
                                     s.hw, s.f, s.engine)
    return {**rates, "weight_bytes_per_s": np.where(curve, measured, rates["weight_bytes_per_s"])}


def _stage(s: _Setup, flops: dict, bytes_: dict, tokens, eager_s=0.0, vector_attention=False) -> dict:
    """One pipeline-stage pass of a micro-batch of ``tokens`` new tokens, offload included; ``eager_s``: host time
    of launching the pass's kernels from Python, beside the device's work (:func:`eager_prefill_time`);
    ``vector_attention``: where its attention is the engine's vector decode kernel (EngineDefaults.vector_decode)."""
    if np.any(np.asarray(s.serving["expert_skew"]) > 0):
        flops, bytes_ = _busiest_rank(s, flops, bytes_, tokens)
    if s.engine.expert_tile_tokens > 0:
        flops = _expert_kernels(s, flops, tokens)
    devices = s.tp * s.pp
    rates = _pass_rates(s, tokens, vector_attention)
    queued_s, overhead_s = pass_host_time(*host_costs(s.engine, s.hw), s.m, tokens, s.pp, s.ep, s.cpu_layers,
                                        s.serving["expert_skew"], overlaps_device(s.engine, s.hw))
    queued_s = queued_s + eager_s
    communication_s = stage_communication_time(s.m, s.hw, tokens, s.tp, s.pp, s.ep, s.engine.allreduce_latency_s,
                                               s.tp_link, s.attention_dp)
    streamed = np.where(s.serving["offload"] == LAYERS, 0.0, 1.0) * streaming_time(
        bytes_["weights"] / devices, s.device_share, s.hw["host_link_bytes_per_s"])
    if np.any(s.cpu_layers > 0):
        # experts in host memory: the host CPU runs them for small passes, else they cross the link per
        # micro-batch and the device runs them (docs/formulas.md §8, llama.cpp GGML_OP_OFFLOAD_MIN_BATCH)
        experts_s, on_cpu = cpu_moe_time(s.m, s.f, s.cpu_layers, tokens, s.host_rates, s.hw["host_link_bytes_per_s"],
                                         s.serving["ubatch_tokens"])
        expert_flops, expert_bytes = cpu_expert_ledgers(s.m, s.f, s.cpu_layers, tokens)
        on_device_flops = {**flops, "linear": flops["linear"] - np.where(on_cpu, expert_flops, 0.0)}
        on_device_bytes = {**bytes_, "weights": bytes_["weights"] - np.where(on_cpu, expert_bytes, 0.0)}
        device = pass_time(on_device_flops, on_device_bytes, rates, devices, overhead_s, communication_s,
                           streamed + experts_s, queued_s)
        device["if_fit_s"] = pass_time(flops, bytes_, rates, devices, overhead_s, communication_s,
                                       overlapped_host_s=queued_s)["time_s"]
    else:
        device = pass_time(flops, bytes_, rates, devices, overhead_s, communication_s, streamed, queued_s)
        device["if_fit_s"] = device["time_s"] - device["offload_s"]   # the same pass with everything on the device
    if s.host_rates is None:
        return device
    # partial offload by layers: the device runs its share of the layers, the host CPU the rest
    g = np.where(s.serving["offload"] == LAYERS, s.device_share, 1.0)
    host_s = pass_time(flops, bytes_, s.host_rates, 1.0, overhead_s + queued_s)["time_s"]   # the CPU computes too
    out = {k: g * device[k] for k in PARTS}
    out["offload_s"] = out["offload_s"] + (1 - g) * host_s
    out["time_s"] = g * device["time_s"] + (1 - g) * host_s
    out["if_fit_s"] = device["if_fit_s"]
    out["bound"] = _bound(out)
    return out


def _bound(parts: dict):
    return bound_of(parts["compute_s"], parts["memory_s"], parts["linear_s"] + parts["attention_s"],
                    parts["communication_s"], parts["offload_s"], parts["overhead_s"])


def _phase(stage: dict, passes, per_step_s, transfer_s) -> dict:
    """A phase made of ``passes`` stage passes, plus the per-step overhead and pipeline transfers."""
    out = {k: stage[k] * passes for k in PARTS + ("time_s", "if_fit_s")}
    out["overhead_s"] = out["overhead_s"] + per_step_s
    out["communication_s"] = out["communication_s"] + transfer_s
    out["time_s"] = out["time_s"] + per_step_s + transfer_s
    out["if_fit_s"] = out["if_fit_s"] + per_step_s + transfer_s
    out["bound"] = _bound(out)
    return out


def _busiest_attention_rank(s: _Setup, flops: dict, bytes_: dict, b) -> tuple[dict, dict]:
    """Under attention data parallelism the b sequences of a micro-batch spread over the tp ranks and the
    busiest holds at least one: below tp sequences its attention work is tp/b times the mean share that the
    pass's division by the devices assumes (docs/formulas.md §8)."""
    if not np.any(s.attention_dp > 0):
        return flops, bytes_
    uneven = np.where(s.attention_dp > 0, np.maximum(s.tp / np.maximum(b, 1e-12), 1.0), 1.0)
    return ({**flops, "attention": flops["attention"] * uneven},
            {k: v if k in ("weights", "activations", "elementwise") else v * uneven for k, v in bytes_.items()})


def _engine_passes(s: _Setup) -> dict:
    """What the engine's code adds to a pass's traffic (docs/formulas.md §13): grouped KV heads copied out or read
    once per query head (for the pass's own model: a draft has its own heads), a quantized cache widened before
    attention, elementwise ops run one kernel each, and the passes over unfused scores and their width."""
    return {"expansion": tr.kv_head_expansion(s.m, s.expands_kv),
            "kv_reads": tr.kv_head_expansion(s.m, s.broadcasts_kv), "attended_bits": s.attended_bits,
            "unfused_ops": s.engine.unfused_elementwise, "score_passes": tr.score_passes(s.m),
            "score_bytes": s.engine.score_bits / 8}


def _host_step_s(s: _Setup, b, micro):
    """The engine's host time per step: a fixed part, and a part per sequence of the replica's batch (with the
    output processing a runtime does before scheduling the next step, blocking_output_per_sequence_s)."""
    return s.engine.per_step_s + (s.engine.per_sequence_s + s.engine.blocking_output_per_sequence_s) * b * micro


def _decode(s: _Setup, b, micro, spans, q=1):
    """Ledgers and phase times of one decode step (q new tokens per sequence) of micro-batches of b."""
    span_global, span_local, span_topk = spans
    span_topk = np.where(s.m["attn_topk"] > 0, span_topk, span_global)   # a draft model may have no top-k cap
    flops = fl.decode_flops(s.m, b, span_global, span_local, span_topk, q=q)
    bytes_ = tr.decode_bytes(s.m, s.f, s.kv_bits, b, span_global, span_local, s.tp, s.scores_on_chip,
                             q=q, span_topk=span_topk, attention_dp=s.attention_dp, **_engine_passes(s))
    flops, bytes_ = _busiest_attention_rank(s, flops, bytes_, b)
    if np.any(np.asarray(s.serving["expert_skew"]) > 0):
        flops, bytes_ = _skewed(s, flops, bytes_, b * q)
    vector = s.engine.vector_decode(s.m, s.fused_attention, q)
    phase = _phase(_stage(s, flops, bytes_, b * q, vector_attention=vector), np.maximum(micro, s.pp),
                   _host_step_s(s, b, micro),
                   pipeline_transfer_time(s.m, b * q, s.pp, s.engine.allreduce_latency_s, s.pp_link))
    return flops, bytes_, phase


def _prefill(s: _Setup, b, micro, T, cached):
    """Ledgers and phase times of prefilling micro-batches of b prompts past ``cached`` tokens. The phase's
    ``launch_excess_s`` is what launching the passes from Python adds to them (docs/formulas.md §14): prompts
    prefilled together share it."""
    flops = fl.prefill_flops(s.m, b, T, cached)
    bytes_ = tr.prefill_bytes(s.m, s.f, s.kv_bits, b, T, s.tp, s.scores_on_chip, cached,
                              attention_dp=s.attention_dp, chunk_tokens=s.chunk_tokens, **_engine_passes(s))
    flops, bytes_ = _busiest_attention_rank(s, flops, bytes_, b)
    new_tokens = b * (T - cached)
    if np.any(np.asarray(s.serving["expert_skew"]) > 0):
        flops, bytes_ = _skewed(s, flops, bytes_, new_tokens)
    passes, step_s = micro + s.pp - 1, _host_step_s(s, b, micro)
    transfer_s = pipeline_transfer_time(s.m, new_tokens, s.pp, s.engine.allreduce_latency_s, s.pp_link)
    eager_s = eager_prefill_time(s.engine, s.m, new_tokens, s.pp)
    phase = _phase(_stage(s, flops, bytes_, new_tokens, eager_s), passes, step_s, transfer_s)
    phase["launch_excess_s"] = 0.0 * phase["time_s"]
    if np.any(eager_s > 0):   # the same passes on the device alone, from the same ledgers
        phase["launch_excess_s"] = phase["time_s"] - _phase(_stage(s, flops, bytes_, new_tokens), passes, step_s,
                                                            transfer_s)["time_s"]
    return flops, bytes_, phase


def _speculative(s: _Setup, draft: dict | None, b, micro, spans, plain_step_s, T, cached):
    """Mean time per token with speculative decoding and the draft's extra prefill time (rows drafting none: 0)."""
    gamma, alpha = np.asarray(s.serving["spec_tokens"], dtype=float), s.serving["acceptance"]   # a value per row
    verify_s = _decode(s, b, micro, spans, q=gamma + 1)[2]["time_s"]
    if draft is None:   # n-gram or EAGLE-style heads: a fixed fraction of a target step
        draft_step_s, draft_prefill_s = s.serving["draft_cost"] * plain_step_s, 0.0
    else:
        d = replace(s, m=draft, device_share=np.ones(1), cpu_layers=np.zeros(1))
        draft_step_s = _decode(d, b, micro, spans)[2]["time_s"]
        draft_prefill_s = _prefill(d, b, micro, T, cached)[2]["time_s"]
    step_s = (gamma * draft_step_s + verify_s) / expected_tokens(alpha, gamma)
    return np.where(gamma > 0, step_s, plain_step_s), np.where(gamma > 0, draft_prefill_s, 0.0)


def results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving=None,
                   engine: EngineDefaults = GENERIC_ENGINE, host=None, draft=None,
                   end_step: bool = False, itl_only: bool = False) -> dict[str, np.ndarray]:
    """Prefill, decode and memory for every configuration the inputs broadcast to.

    Parameters
    ----------
    m, hw, f, kv : dict
        Model, hardware, weight-format and KV-format columns (:mod:`estimator.evaluation.columns`).
    peak_linear_flops_per_s : array
        Dense peak of the weight format's compute dtype on the device.
    B, T, O : array
        Concurrent sequences (over all replicas), prompt tokens, output tokens.
    layout : dict
        ``tp``, ``pp``, ``ep``, ``dp`` arrays, optionally ``node`` (devices per scale-up domain) and
        ``network_bytes_per_s`` (:mod:`estimator.physics.parallel`).
    serving : dict
        ``paged`` KV allocation, ``block_tokens``, cached ``prefix_tokens`` per prompt (stored once),
        ``prefix_hit_rate`` (the share of the other prompt tokens found in the prefix cache),
        ``fused_attention``, ``offload`` mode and ``gpu_layers``, ``cpu_moe`` (MoE layers whose routed
        experts are in host memory; ``inf``: all) and ``ubatch_tokens`` (:data:`DEFAULT_SERVING`).
    host : dict, optional
        The host CPU's effective ``rates`` (as :func:`effective_rates`), for partial offload by layers
        and for experts on the host (needed when ``cpu_moe`` > 0).
    draft : dict, optional
        Model columns of a draft model for speculative decoding (``spec_tokens`` > 0 in ``serving``).
    end_step : bool
        Also time the generation's last decode step (``itl_end_s``, at the full context P + O).
    itl_only : bool
        Return only ``itl_s``: what a steady state's fixed-point iteration asks for at each trial batch.

    Notes
    -----
    Each replica decodes B/dp sequences in m = min(B/dp, pp) micro-batches. One
    pipeline-stage pass costs the roofline time of the micro-batch's ledgers
    divided over the replica's tp·pp devices, plus its collectives, offload
    transfers and per-layer overheads; a decode cycle takes max(m, pp) stage
    passes and prefill m + pp − 1, plus the per-step overhead and the
    stage-to-stage transfers.
    """
    B, T, O = (np.asarray(a, dtype=float) for a in (B, T, O))
    tp, pp, ep, dp = (np.asarray(layout[k], dtype=float) for k in ("tp", "pp", "ep", "dp"))
    attention_dp = np.asarray(layout.get("attention_dp", 0.0), dtype=float)
    kv_tp = tr.kv_split_ranks(tp, attention_dp)   # the ranks a cache entry is split over
    serving = {**DEFAULT_SERVING, **(serving or {})}
    # prompt tokens served from cache: the shared prefix, and a share H of the rest (a prefix-cache hit
    # rate, docs/formulas.md §14): they skip prefill, but attention still spans the whole prompt. The
    # last prompt token is always computed (its logits start the output), as engines do on a full hit.
    prefix = np.asarray(serving["prefix_tokens"], dtype=float)
    cached = np.maximum(np.minimum(prefix + np.asarray(serving["prefix_hit_rate"], dtype=float) * (T - prefix),
                                   T - 1), prefix)
    kv_bits = kv["kv_bits"]
    replica_batch = B / dp
    micro = micro_batches(replica_batch, pp)
    b = replica_batch / micro                                 # sequences per micro-batch

    cpu_layers = cpu_moe_layers(serving["cpu_moe"], m["moe_layers"])
    if np.any(cpu_layers > 0) and host is None:
        raise ConfigurationError("MoE experts on the host CPU (cpu_moe) need the host CPU's rates; pass host=")
    host_experts = cpu_expert_bytes_stored(m, f, cpu_layers) / (tp * pp)   # held in host RAM, not on the device
    # so is an input embedding the engine keeps there (an untied one: a tied table is also the output head)
    host_weights = host_experts + np.where(engine.embedding_on_host, tr.input_embedding_bytes(m, f), 0.0) / (tp * pp)
    budget = memory_budget(engine, tp, serving["ubatch_tokens"])
    budget["warmup_bytes"] = sampler_warmup_bytes(engine.sampler_warmup_bytes_per_logit, m["vocab"],
                                                  serving["profiled_sequences"])
    # the workspace holds a score matrix only where the engine's attention writes one
    fused_attention = engine.attention_fused(serving["fused_attention"], m["softcapped_scores"])
    scores_on_chip = engine.scores_on_chip(fused_attention)
    held = {**serving, "fused_attention": scores_on_chip}
    memory = memory_fit(m, f, kv_bits, hw, replica_batch, T, O, tp, pp, held, draft=draft,
                        host_weight_bytes=host_weights, attention_dp=attention_dp, **budget)
    share = device_weight_share(serving["offload"], serving["gpu_layers"], m["layers"],
                                memory["memory_weights_bytes"], memory["room_for_weights_bytes"])
    if serving["offload"] != NONE:  # re-plan the memory with the offloaded part on the host
        kv_share = np.where(serving["offload"] == LAYERS, share, 1.0)
        memory = memory_fit(m, f, kv_bits, hw, replica_batch, T, O, tp, pp, held, share, kv_share, draft,
                            host_weight_bytes=host_weights, attention_dp=attention_dp, **budget)
    node = np.asarray(layout.get("node", DEFAULT_NODE_DEVICES), dtype=float)
    network = np.asarray(layout.get("network_bytes_per_s", DEFAULT_NETWORK_BYTES_PER_S), dtype=float)
    s = _Setup(m, hw, f, kv_bits, tp, pp, ep, serving, engine, effective_rates(hw, f, peak_linear_flops_per_s, engine),
               host, share, cpu_layers, tp_link_bytes_per_s(hw, tp, node, network),
               pp_link_bytes_per_s(hw, tp, pp, node, network), attention_dp, fused_attention, scores_on_chip,
               engine.expands_kv_heads(fused_attention), engine.broadcasts_kv_heads(fused_attention),
               engine.attended_kv_bits(kv_bits), np.asarray(budget["chunk_tokens"], dtype=float))

    lo, hi, steps = decode_context_range(T, O)
    span_global = mean_span(lo, hi, 0)
    # mean attended tokens: all, within the window, within a sparse-attention top-k (docs/formulas.md §15.2)
    spans = (span_global, mean_span(lo, hi, m["window"]), mean_span(lo, hi, m["attn_topk"]))
    decode_flops, decode_bytes, decode = _decode(s, b, micro, spans)
    itl_s, draft_prefill_s = decode["time_s"], 0.0
    if np.any(np.asarray(serving["spec_tokens"]) > 0):
        itl_s, draft_prefill_s = _speculative(s, draft, b, micro, spans, decode["time_s"], T, cached)
    if itl_only:
        return {"itl_s": itl_s}
    prefill_flops, prefill_bytes, prefill = _prefill(s, b, micro, T, cached)
    # the device's free KV space (what the batch leaves): where cached prefixes live beside any second tier
    free_kv_bytes = np.maximum(memory["memory_available_bytes"] - memory["memory_required_bytes"], 0.0)
    tier_s = _tier_load_s(s, free_kv_bytes, b, micro, cached - prefix, tp * pp)
    ttft_s = prefill["time_s"] + tier_s + draft_prefill_s

    out = phase_speeds(B, T, O, cached, ttft_s, itl_s, steps)
    out["speculative_speedup"] = decode["time_s"] / itl_s
    if end_step:   # the last step attends to the whole context: where a long (reasoning) output ends
        end = (hi, mean_span(hi, hi, m["window"]), mean_span(hi, hi, m["attn_topk"]))
        out["itl_end_s"] = _decode(s, b, micro, end)[2]["time_s"] * itl_s / decode["time_s"]
    out.update({
        "micro_batches": micro, "prefill_bound": prefill["bound"], "decode_bound": decode["bound"],
        "prefill_intensity_flops_per_byte": fl.total(prefill_flops) / sum(prefill_bytes.values()),
        "decode_intensity_flops_per_byte": fl.total(decode_flops) / sum(decode_bytes.values()),
        "ridge_flops_per_byte": peak_linear_flops_per_s / hw["bandwidth_bytes_per_s"],
        "critical_batch": _critical_batch(s, b),
        "weights_per_sm_bound_bytes_per_s": s.rates["weights_per_sm_bound_bytes_per_s"] + 0 * B,
        # the same, counted in concurrent sequences over all replicas and micro-batches
        "compute_bound_concurrency": _critical_batch(s, b) * micro * dp,
        "mean_decode_context": span_global,
        "cached_tokens": cached + 0 * B,
        "kv_tier_load_s": tier_s + 0 * B,
        "prefill_launch_excess_s": prefill["launch_excess_s"] + 0 * B,
        # prompt tokens the prefix cache can keep: the device's free KV space and the second tier, if any
        "prefix_cache_tokens": (free_kv_bytes + np.asarray(serving["kv_tier_bytes"], dtype=float) / (tp * pp))
        / (kv_cache_bytes_per_sequence(m, kv_bits, 1.0, kv_tp) / (tp * pp)),
    })
    for phase, times in (("prefill", prefill), ("decode", decode)):
        out.update({f"{phase}_{key}": times[key] for key in PARTS})
    for name, ledger in (("prefill_flops", prefill_flops), ("prefill_bytes", prefill_bytes),
                         ("decode_flops", decode_flops), ("decode_bytes", decode_bytes)):
        out.update({f"{name}_{term}": value for term, value in ledger.items()})
        out[f"{name}_total"] = sum(ledger.values())
    memory.pop("room_for_weights_bytes")
    out.update(memory)
    out["max_batch"] = out["max_batch"] * dp
    out["max_concurrency"] = out["max_batch"]
    out["kv_cache_bytes_per_token"] = tr.kv_bytes_per_token(m, kv_bits) + 0 * B
    out["offloaded_bytes"] = tr.weight_bytes_stored(m, f) / (tp * pp) * (1 - share) + host_experts
    out["throughput_out_tps_per_gpu"] = out["throughput_out_tps"] / (tp * pp * dp)
    out["kv_crossover_tokens"] = tr.kv_crossover_tokens(m, f, kv_bits, b, kv_tp)
    # how much faster the same configuration would decode with everything on the device
    out["offload_slowdown"] = decode["time_s"] / decode["if_fit_s"]
    return out


def _tier_load_s(s: _Setup, free_kv_bytes, b, micro, hit_tokens, devices):
    """Copying the prefix-cache hits held in a second KV tier back to the device, per prefill of the micro-batches
    (:mod:`estimator.physics.kv_tiers`)."""
    tier_bytes = np.asarray(s.serving["kv_tier_bytes"], dtype=float)
    if not np.any(tier_bytes > 0):
        return 0.0
    rate = np.where(s.serving["kv_tier"] == DISK, DISK_READ_BYTES_PER_S / devices,   # one drive per replica
                    s.hw["host_link_bytes_per_s"] * HOST_LINK_EFFICIENCY)
    hit_bytes = kv_cache_bytes_per_sequence(s.m, s.kv_bits, hit_tokens, tr.kv_split_ranks(s.tp, s.attention_dp)) \
        / devices * b * micro
    return tier_load_time(hit_bytes, tier_bytes / devices, free_kv_bytes, rate)


def _critical_batch(s: _Setup, b):
    """Batch at which the decode matmuls' compute time reaches their weight-streaming time."""
    matmul_flops_per_token = 2 * (fl.matmul_params_per_token(s.m) + s.m["params_head"])
    return (tr.weight_bytes_streamed(s.m, s.f, b) * s.rates["linear_flops_per_s"]
            / (matmul_flops_per_token * s.rates["weight_bytes_per_s"]))
