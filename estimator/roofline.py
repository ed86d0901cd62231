"""Roofline timing of one forward pass from its FLOP and byte ledgers.

A pass runs two kinds of kernels one after the other: the linear layers
(weights, activations, output head) and attention (KV cache, scores). Within
each kind, compute and memory traffic overlap fully, so its time is the larger
of the two (the lower bound T_lower = max(T_math, T_mem) of the scaling book's
roofline chapter); the two kinds add, since they are separate kernels. Decode
attention is memory-bound on every GPU for GQA models (its intensity is about
2·G / bytes-per-KV-element, far below any ridge point), while the linear layers
cross over at the critical batch (FORMULAS.md §4). Fixed per-step and per-layer
overheads are added on top.

Every rate is an *effective* rate: datasheet peak × device efficiency × engine
efficiency (ARCHITECTURE.md). All arrays broadcast.
"""

from __future__ import annotations

import numpy as np

BOUND_NAMES = ("memory", "compute", "overhead")  # overhead: fixed costs and communication dominate
MEMORY, COMPUTE, OVERHEAD = range(3)


def allreduce_time(message_bytes, n_gpus, link_bytes_per_s, latency_s):
    """Ring all-reduce of ``message_bytes`` over N ranks: 2(N−1)/N · M / link bandwidth + a fixed latency.

    Zero for one device (FORMULAS.md §8; NCCL's bus bandwidth convention).
    """
    n = np.asarray(n_gpus, dtype=float)
    return np.where(n > 1, latency_s + 2 * (n - 1) / n * message_bytes / link_bytes_per_s, 0.0)


def pass_time(flops, bytes_, rates, n_gpus, layers, overheads, communication_s=0.0):
    """Time of one forward pass, and its parts.

    Parameters
    ----------
    flops, bytes_ : dict
        Ledgers from :mod:`estimator.flops` and :mod:`estimator.traffic` (replica totals).
    rates : dict
        Effective per-device rates: ``linear_flops_per_s``, ``attention_flops_per_s``,
        ``weight_bytes_per_s`` and ``kv_bytes_per_s``.
    n_gpus : array
        Tensor-parallel devices sharing the work evenly.
    overheads : dict
        ``per_step_s`` and ``per_layer_s``.
    communication_s : array
        Tensor-parallel all-reduce time of the pass, not overlapped with compute.

    Notes
    -----
    t = max(F_lin / R_c, B_lin / R_w) + max(F_att / R_att, B_att / R_kv) + t_comm + t_step + L · t_layer,
    with every ledger term divided by the N devices that share it.
    """
    n = np.asarray(n_gpus, dtype=float)
    linear_compute_s = (flops["linear"] + flops["head"]) / (n * rates["linear_flops_per_s"])
    linear_memory_s = (bytes_["weights"] + bytes_["activations"]) / (n * rates["weight_bytes_per_s"])
    attention_bytes = sum(v for k, v in bytes_.items() if k not in ("weights", "activations"))
    attention_compute_s = flops["attention"] / (n * rates["attention_flops_per_s"])
    attention_memory_s = attention_bytes / (n * rates["kv_bytes_per_s"])
    overhead_s = overheads["per_step_s"] + layers * overheads["per_layer_s"]
    linear_s = np.maximum(linear_compute_s, linear_memory_s)
    attention_s = np.maximum(attention_compute_s, attention_memory_s)
    compute_s = linear_compute_s + attention_compute_s
    memory_s = linear_memory_s + attention_memory_s
    fixed_s = overhead_s + communication_s
    bound = np.where(fixed_s > linear_s + attention_s, OVERHEAD, np.where(compute_s > memory_s, COMPUTE, MEMORY))
    return {
        "time_s": linear_s + attention_s + fixed_s,
        "communication_s": communication_s + 0 * linear_s,
        "linear_s": linear_s,
        "attention_s": attention_s,
        "overhead_s": overhead_s + 0 * linear_s,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "bound": bound,
    }
