"""Roofline timing of one forward pass from its FLOP and byte ledgers.

A pass runs two kinds of kernels one after the other: the linear layers
(weights, activations, output head) and attention (KV cache, scores). Within
each kind, compute and memory traffic overlap fully, so its time is the larger
of the two (the lower bound T_lower = max(T_math, T_mem) of the scaling book's
roofline chapter); the two kinds add, since they are separate kernels. Decode
attention is memory-bound on every GPU for GQA models (its intensity is about
2·G / bytes-per-KV-element, far below any ridge point), while the linear layers
cross over at the critical batch (docs/formulas.md §4). Communication and fixed
overheads are added on top, not overlapped.

Every rate is an *effective* rate: datasheet peak × device efficiency × engine
efficiency (docs/architecture.md). All arrays broadcast.
"""

from __future__ import annotations

import numpy as np

BOUND_NAMES = ("memory", "compute", "overhead", "communication", "offload")
MEMORY, COMPUTE, OVERHEAD, COMMUNICATION, OFFLOAD = range(5)


def pass_time(flops, bytes_, rates, n_devices, overhead_s, communication_s=0.0, offload_s=0.0, overlapped_host_s=0.0):
    """Time of one forward pass (or pipeline-stage pass), and its parts.

    Parameters
    ----------
    flops, bytes_ : dict
        Ledgers from :mod:`estimator.physics.flops` and :mod:`estimator.physics.traffic`.
    rates : dict
        Effective per-device rates: ``linear_flops_per_s``, ``attention_flops_per_s``,
        ``weight_bytes_per_s``, ``kv_bytes_per_s``, ``kv_expand_bytes_per_s`` (the copy that expands
        grouped KV heads, ledger term ``kv_expand``) and ``stream_bytes_per_s`` (unfused elementwise ops,
        ledger term ``elementwise``, timed with the linear layers they sit between; and unfused attention's
        softmax and soft-cap kernels, ledger term ``score_ops``, timed with the attention they sit in).
    n_devices : array
        Devices sharing the ledgers evenly.
    overhead_s, communication_s, offload_s : array
        Fixed costs (launches, scheduling), collective time and host-link transfers of offloaded
        weights, none of them overlapped with compute.
    overlapped_host_s : array
        Host time that runs while the device works (ops launched asynchronously, one at a time, by an
        eager engine): the pass lasts the longer of the two, and what the host adds beyond the device's
        time counts as overhead.

    Notes
    -----
    t = max(max(F_lin / R_c, B_lin / R_w) + B_elt / R_s + max(F_att / R_att, B_att / R_kv + B_exp / R_exp)
            + B_sc / R_s + t_comm + t_offload, t_host) + t_fixed,
    every ledger term divided by the devices that share it. The bound is the largest of
    the roofline part (memory or compute, whichever its kernels wait on), the
    communication, the offload transfers and the fixed overheads.
    """
    n = np.asarray(n_devices, dtype=float)
    linear_compute_s = (flops["linear"] + flops["head"]) / (n * rates["linear_flops_per_s"])
    linear_memory_s = (bytes_["weights"] + bytes_["activations"]) / (n * rates["weight_bytes_per_s"])
    # unfused elementwise ops are kernels of their own beside the GEMMs: their passes add, at the stream rate
    elementwise_s = bytes_["elementwise"] / (n * rates["stream_bytes_per_s"])
    # so are unfused attention's softmax and soft-cap passes over the scores, beside its matmuls
    score_ops_s = bytes_["score_ops"] / (n * rates["stream_bytes_per_s"])
    attention_bytes = sum(v for k, v in bytes_.items()
                          if k not in ("weights", "activations", "kv_expand", "elementwise", "score_ops"))
    attention_compute_s = flops["attention"] / (n * rates["attention_flops_per_s"])
    attention_memory_s = (attention_bytes / (n * rates["kv_bytes_per_s"])
                          + bytes_["kv_expand"] / (n * rates["kv_expand_bytes_per_s"]))
    linear_s = np.maximum(linear_compute_s, linear_memory_s) + elementwise_s
    attention_s = np.maximum(attention_compute_s, attention_memory_s) + score_ops_s
    compute_s = linear_compute_s + attention_compute_s
    memory_s = linear_memory_s + attention_memory_s + elementwise_s + score_ops_s
    roofline_s = linear_s + attention_s
    zero = 0 * roofline_s
    overhead_s = overhead_s + np.maximum(overlapped_host_s - (roofline_s + communication_s + offload_s), 0.0)
    return {
        "time_s": roofline_s + communication_s + offload_s + overhead_s,
        "linear_s": linear_s,
        "attention_s": attention_s,
        "communication_s": communication_s + zero,
        "offload_s": offload_s + zero,
        "overhead_s": overhead_s + zero,
        "compute_s": compute_s,
        "memory_s": memory_s,
        "bound": bound_of(compute_s, memory_s, roofline_s, communication_s, offload_s, overhead_s),
    }


def bound_of(compute_s, memory_s, roofline_s, communication_s, offload_s, overhead_s):
    """The largest part of a pass's time: its kernels (memory or compute), communication, offload or overhead."""
    parts = np.stack(np.broadcast_arrays(roofline_s, communication_s, offload_s, overhead_s))
    kernels = np.where(compute_s > memory_s, COMPUTE, MEMORY)
    return np.choose(np.argmax(parts, axis=0), [kernels, COMMUNICATION, OFFLOAD, OVERHEAD])
