"""Parallel layouts: tensor (tp), pipeline (pp), expert (ep) and data (dp) parallelism.

A replica spans ``tp × pp`` devices; ``dp`` replicas serve independent requests,
so ``devices = tp × pp × dp`` and each replica decodes ``batch / dp`` sequences.

- **TP** (Megatron): weights and KV heads split over tp ranks; two all-reduces
  of the activations per layer (docs/formulas.md §8), ring cost
  ``latency + 2(t−1)/t · M / bus`` at the bus bandwidth a collective reaches,
  a share η_coll of the link's one-way datasheet bandwidth.
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
- **Attention DP** (SGLang ``--enable-dp-attention``, TensorRT-LLM
  ``enable_attention_dp``; "DEP" with EP): the tp ranks run attention on their
  own sequences with whole weights and whole cache entries, so attention needs
  no all-reduce; each MLP and MoE layer all-gathers every rank's tokens and
  reduce-scatters its output (an all-reduce's volume), its weights split by tp
  or, for experts, by ep (docs/formulas.md §8).
- **Nodes**: a node holds ``node`` devices on its scale-up link (NVLink,
  Infinity Fabric; 8 in an HGX/DGX server, 72 in a GB200 NVL72 rack). Collectives
  of a TP group larger than a node, and pipeline hops between stages on
  different nodes, run over the scale-out network instead (InfiniBand NDR:
  400 Gb/s = 50 GB/s per device and direction by default).

All functions broadcast.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.traffic import ACTIVATION_BYTES

DEFAULT_NODE_DEVICES = 8                  # an HGX/DGX server
DEFAULT_NETWORK_BYTES_PER_S = 400e9 / 8   # one InfiniBand NDR port per device, one direction


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


def tp_link_bytes_per_s(hw, tp, node, network_bytes_per_s):
    """The bus bandwidth a TP group's collectives reach: η_coll of the link they run over, scale-up within a
    node, the network across nodes (docs/formulas.md §8)."""
    link = np.where(np.asarray(tp) > node, np.minimum(network_bytes_per_s, hw["link_bytes_per_s"]),
                    hw["link_bytes_per_s"])
    return hw["collective_eff"] * link


def pp_link_bytes_per_s(hw, tp, pp, node, network_bytes_per_s):
    """The link between pipeline stages: the network once the replica spans more than one node."""
    return np.where(np.asarray(tp) * pp > node, np.minimum(network_bytes_per_s, hw["link_bytes_per_s"]),
                    hw["link_bytes_per_s"])


def stage_communication_time(m, hw, tokens, tp, pp, ep, latency_s, link, attention_dp=0):
    """All-reduces (and all-to-alls) of one micro-batch of ``tokens`` passing one pipeline stage over ``link``.

    Under attention data parallelism attention needs no all-reduce; every MLP and MoE layer gathers all ranks'
    tokens and reduce-scatters its output, an all-reduce's volume, whether its experts are split by tp or ep.
    """
    hidden_bytes = tokens * m["hidden"] * ACTIVATION_BYTES
    layers, moe_layers = m["layers"] / pp, m["moe_layers"] / pp
    adp = np.asarray(attention_dp) > 0
    attention_allreduce = np.where(adp, 0.0, layers * allreduce_time(hidden_bytes, tp, link, latency_s))
    uses_a2a = (np.asarray(ep) > 1) & (m["moe_layers"] > 0) & ~adp
    dense_mlp_allreduce = (layers - np.where(uses_a2a, moe_layers, 0.0)) * allreduce_time(
        hidden_bytes, tp, link, latency_s)
    dispatch_bytes = hidden_bytes * m["experts_per_token"]
    expert_a2a = np.where(uses_a2a, 2 * moe_layers * all_to_all_time(dispatch_bytes, ep, link, latency_s), 0.0)
    return attention_allreduce + dense_mlp_allreduce + expert_a2a


def pipeline_transfer_time(m, tokens, pp, latency_s, link):
    """Activations of one micro-batch crossing the pp − 1 stage boundaries over ``link``."""
    per_hop = latency_s + tokens * m["hidden"] * ACTIVATION_BYTES / link
    return np.where(np.asarray(pp) > 1, (np.asarray(pp, dtype=float) - 1) * per_hop, 0.0)
