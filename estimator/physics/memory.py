"""Memory footprint per device, whether it fits, and the largest batch that does.

required = weights / N + KV cache + activation workspace + runtime reserve
available = capacity × usable fraction

- Weights count **all** parameters, every expert included (llmfit #230 counted
  active parameters and recommended models that do not fit), except the experts
  kept in host memory (``host_weight_bytes``; llama.cpp ``--n-cpu-moe``).
- The KV cache is allocated for the whole context (prompt + output) of every
  sequence, in paged blocks or contiguously (:mod:`estimator.physics.kvcache`); a cached
  prefix is stored once; sliding-window layers keep at most W tokens; layers that share
  an earlier layer's cache hold none, and Gated DeltaNet layers hold a fixed-size state
  per sequence instead (docs/formulas.md §15).
- The activation workspace is the prefill peak: one layer's matmul outputs for
  the prompt tokens of one forward pass, the fp32 logits of the last positions
  and, without fused attention, one layer's T×T score matrices. Engines prefill
  at most a token budget per pass (vLLM ``max_num_batched_tokens``, 8192 by
  default in V1), but never less than one whole prompt (chunking a prompt is the
  serving-level model's), so the workspace stops growing with the batch there.
  An engine that sizes its cache from a profile run which also warms its sampler up
  (vLLM: one dummy request per sequence it may run) keeps the larger of the two peaks.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.kvcache import allocated_tokens
from estimator.physics.traffic import (
    ACTIVATION_BYTES,
    LOGIT_BYTES,
    kv_bytes_per_token_layer,
    kv_replication,
    kv_split_ranks,
    replicated_attention_bytes,
    state_bytes_per_sequence,
    weight_bytes_stored,
)


def kv_cache_bytes_per_sequence(m, kv_bits, context, tp):
    """KV bytes one sequence of ``context`` tokens holds, over all devices of the replica (copies under TP included).

    Only the layers that hold their own cache count (``kv_layers``: no linear-attention or KV-sharing layers).
    """
    global_layers = m["kv_layers"] - m["kv_local_layers"]
    local_kept = np.where(m["window"] > 0, np.minimum(context, m["window"]), context)
    token_layers = global_layers * context + m["kv_local_layers"] * local_kept
    return kv_bytes_per_token_layer(m, kv_bits) * kv_replication(m, tp) * token_layers


PREFILL_TOKEN_BUDGET = 8192
SCORE_BYTES = 4   # an unfused score matrix is fp32 at its softmax (llama.cpp's KQ is F32; eager models upcast)


def activation_workspace_bytes(m, B, T, fused_attention, chunk_tokens=np.inf):
    """Prefill workspace of the peak layer for B prompts of T tokens, within the token budget; an engine that
    splits prompts into chunks of ``chunk_tokens`` (vLLM V1 and SGLang chunks, llama.cpp's micro-batches,
    ExLlamaV2's max_input_len) never holds more than one chunk's, and without fused attention its scores are
    one chunk's queries against the prompt's keys, not T × T."""
    tokens = np.minimum(np.minimum(B * T, np.maximum(T, PREFILL_TOKEN_BUDGET)), chunk_tokens)
    sequences = np.maximum(np.floor(tokens / np.maximum(T, 1)), 1)
    queries = np.minimum(T, tokens)          # one sequence's queries in the pass (a chunk of its prompt)
    widest = np.maximum(m["ffn_width"], (m["heads"] + 2 * m["kv_heads"]) * m["head_dim"])
    matmul_outputs = tokens * (2 * m["hidden"] + widest) * ACTIVATION_BYTES
    scores = np.where(fused_attention, 0.0, sequences * m["heads"] * queries * T * SCORE_BYTES)
    return matmul_outputs + scores + np.minimum(B, sequences) * m["vocab"] * LOGIT_BYTES


def sampler_warmup_bytes(bytes_per_logit, vocab, sequences):
    """Device bytes of an engine's sampler warm-up on ``sequences`` dummy requests, the most it may run (inf: the
    engine sets no cap and warms nothing up): their logits over the ``vocab`` at ``bytes_per_logit`` (vLLM's
    ``sampler_warmup_bytes_per_logit``, docs/formulas.md §3). Every tensor-parallel rank samples the whole
    vocabulary, so it is not split."""
    sequences = np.asarray(sequences, dtype=float)
    return bytes_per_logit * np.where(np.isfinite(sequences), sequences, 0.0) * vocab


def memory_fit(m, f, kv_bits, hw, B, T, O, tp, pp, serving, weight_share=1.0, kv_share=1.0, draft=None,
               host_weight_bytes=0.0, attention_dp=0, engine_share=1.0, kv_free_fraction=1.0,
               chunk_tokens=np.inf, warmup_bytes=0.0):
    """Per-device footprint of one replica of tp × pp devices serving B sequences, and its largest batch.

    ``serving`` holds ``paged``, ``block_tokens``, ``prefix_tokens`` and ``fused_attention``
    (:mod:`estimator.physics.kvcache`); a cached prefix is stored once per replica. ``weight_share`` and
    ``kv_share`` are the parts kept on the device when the rest is offloaded (:mod:`estimator.physics.offload`).
    A speculative ``draft`` model (columns) keeps its weights and its own KV cache on the device too.
    ``host_weight_bytes`` (per device) are weights held in host memory instead, such as MoE experts run
    or copied from the host (llama.cpp ``--n-cpu-moe``, docs/formulas.md §8): the device does not hold them.
    Under ``attention_dp`` each rank holds the whole attention weights and whole cache entries of its own
    sequences (docs/formulas.md §8). The engine's own budget: it uses ``engine_share`` of the device's memory
    (vLLM's gpu_memory_utilization), and its KV cache takes ``kv_free_fraction`` of what weights, workspace and
    reserve leave (TensorRT-LLM's free_gpu_memory_fraction), and its prefill workspace holds at most one chunk
    of ``chunk_tokens`` prompt tokens (docs/formulas.md §3). ``warmup_bytes`` (per device) is the peak of the
    engine's sampler warm-up on its profile run (:func:`sampler_warmup_bytes`), which the workspace is when it is
    larger (vLLM).
    """
    n = np.asarray(tp, dtype=float) * pp
    paged, block, prefix = serving["paged"], serving["block_tokens"], serving["prefix_tokens"]
    fused_attention = serving["fused_attention"]
    weights = (weight_bytes_stored(m, f) + replicated_attention_bytes(m, f, tp, attention_dp)) / n * weight_share \
        - host_weight_bytes
    kv_tp = kv_split_ranks(tp, attention_dp)
    # a shared prefix is cached once per replica, or once per rank when each runs attention on its own sequences
    prefix_copies = np.where(np.asarray(attention_dp) > 0, tp, 1.0)
    own_slots = allocated_tokens(T + O - prefix, paged, block, m["max_context"])
    shared = kv_cache_bytes_per_sequence(m, kv_bits, allocated_tokens(prefix, paged, block, m["max_context"]),
                                         kv_tp) * prefix_copies / n
    # a Gated DeltaNet state is per sequence, not per token: never shared with the prefix (docs/formulas.md §15.1)
    kv_per_seq = (kv_cache_bytes_per_sequence(m, kv_bits, own_slots, kv_tp) + state_bytes_per_sequence(m, kv_tp)) \
        / n * kv_share
    shared = shared * kv_share
    if draft is not None:
        weights = weights + weight_bytes_stored(draft, f) / n
        kv_per_seq = kv_per_seq + (kv_cache_bytes_per_sequence(draft, kv_bits, own_slots, kv_tp)
                                   + state_bytes_per_sequence(draft, kv_tp)) / n
    def workspace_at(batch):
        """The per-device workspace at ``batch``: the prefill peak, or the sampler warm-up where that is larger."""
        return np.maximum(activation_workspace_bytes(m, batch, T, fused_attention, chunk_tokens) / tp, warmup_bytes)

    activations = workspace_at(B)
    reserve = hw["runtime_reserve_bytes"]
    available = hw["capacity_bytes"] * hw["usable_memory_fraction"] * engine_share
    required = weights + shared + B * kv_per_seq + activations + reserve

    def kv_room(workspace):
        """Bytes the sequences' own KV entries may take beside weights, reserve, workspace and the prefix."""
        return kv_free_fraction * (available - weights - reserve - workspace) - shared

    # the workspace grows with the batch up to the token budget: size it at one sequence, then at that
    # batch; the second answer is feasible, since a smaller batch never needs a larger workspace
    def largest_batch(at_batch):
        return np.floor(np.maximum(kv_room(workspace_at(at_batch)), 0) / kv_per_seq)

    max_batch = largest_batch(np.maximum(largest_batch(1), 1))
    return {
        "memory_weights_bytes": weights,
        "memory_kv_cache_bytes": shared + B * kv_per_seq,
        "memory_activation_bytes": activations,
        "memory_reserve_bytes": reserve + 0 * weights,
        "memory_required_bytes": required,
        "memory_available_bytes": available + 0 * weights,
        # the same as required <= available when the KV cache may take all that is left (f = 1)
        "fits": B * kv_per_seq <= kv_room(activations),
        "max_batch": max_batch,
        # what the weights have left beside KV, workspace and reserve: the offload planner's budget
        "room_for_weights_bytes": available - shared - B * kv_per_seq - activations - reserve,
    }
