"""Parallel layouts: tensor (tp), pipeline (pp), expert (ep) and data (dp) parallelism.

A replica spans ``tp × pp`` devices; ``dp`` replicas serve independent requests,
so ``devices = tp × pp × dp`` and each replica decodes ``batch / dp`` sequences.

- **TP** (Megatron): weights and KV heads split over tp ranks; two all-reduces
  of the activations per layer (FORMULAS.md §8), ring cost
  ``latency + 2(t−1)/t · M / link``.
- **PP**: each of pp stages holds L/pp layers. A batch is cut into
  m = min(B, pp) micro-batches; every sequence advances one token per cycle of
  ``max(m, pp)`` stage passes, so with fewer micro-batches than stages the
  pipeline idles (the bubble) and one sequence gets no faster than on a single
  stage's devices (GenZ: (m + p − 1) · t_stage for m micro-batches).
  Activations cross pp − 1 stage boundaries point-to-point.
- **EP**: routed experts split over ep ranks of the TP group; MoE layers replace
  their MLP all-reduce by an all-to-all dispatch and combine of the tokens'
  hidden states to the ranks holding their k experts, each moving
  ``(e−1)/e · tokens · k · d`` elements (BLIS; GenZ t_A2A). Routing is assumed
  balanced: the busiest rank holds the mean share of the expected experts.

All functions broadcast.
"""

from __future__ import annotations

import numpy as np

from estimator.traffic import ACTIVATION_BYTES


def allreduce_time(message_bytes, ranks, link_bytes_per_s, latency_s):
    """Ring all-reduce over ``ranks``: latency + 2(N−1)/N · M / link; zero for one rank."""
    n = np.asarray(ranks, dtype=float)
    return np.where(n > 1, latency_s + 2 * (n - 1) / n * message_bytes / link_bytes_per_s, 0.0)


def all_to_all_time(message_bytes, ranks, link_bytes_per_s, latency_s):
    """All-to-all of ``message_bytes`` spread over ``ranks``: latency + (N−1)/N · M / link."""
    n = np.asarray(ranks, dtype=float)
    return np.where(n > 1, latency_s + (n - 1) / n * message_bytes / link_bytes_per_s, 0.0)


def micro_batches(batch, pp):
    """Micro-batches a pipeline cuts a batch into: min(B, pp), at least one."""
    return np.maximum(np.minimum(batch, pp), 1.0)


def stage_communication_time(m, hw, tokens, tp, pp, ep, latency_s):
    """All-reduces (and all-to-alls) of one micro-batch of ``tokens`` passing one pipeline stage."""
    hidden_bytes = tokens * m["hidden"] * ACTIVATION_BYTES
    layers, moe_layers = m["layers"] / pp, m["moe_layers"] / pp
    link = hw["link_bytes_per_s"]
    attention_allreduce = layers * allreduce_time(hidden_bytes, tp, link, latency_s)
    uses_a2a = (np.asarray(ep) > 1) & (m["moe_layers"] > 0)
    dense_mlp_allreduce = (layers - np.where(uses_a2a, moe_layers, 0.0)) * allreduce_time(
        hidden_bytes, tp, link, latency_s)
    dispatch_bytes = hidden_bytes * m["experts_per_token"]
    expert_a2a = np.where(uses_a2a, 2 * moe_layers * all_to_all_time(dispatch_bytes, ep, link, latency_s), 0.0)
    return attention_allreduce + dense_mlp_allreduce + expert_a2a


def pipeline_transfer_time(m, hw, tokens, pp, latency_s):
    """Activations of one micro-batch crossing the pp − 1 stage boundaries."""
    per_hop = latency_s + tokens * m["hidden"] * ACTIVATION_BYTES / hw["link_bytes_per_s"]
    return np.where(np.asarray(pp) > 1, (np.asarray(pp, dtype=float) - 1) * per_hop, 0.0)
