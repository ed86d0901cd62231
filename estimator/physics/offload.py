"""Running a model that does not fit: weights kept in host memory.

Two ways engines do it:

- **Streaming** (``offload="auto"``; vLLM ``--cpu-offload-gb``, Hugging Face
  accelerate): the weights that do not fit stay in host memory and cross the
  host link (PCIe, or NVLink-C2C on GH200/GB200) on every forward pass. The
  device computes everything; the transfer is not overlapped (an upper bound on
  the time, as engines prefetch only partly).
- **Partial offload by layers** (``gpu_layers=N``; llama.cpp ``-ngl N``): N
  layers and their KV cache live on the device, the rest are computed by the
  host CPU at the host's memory bandwidth. A token passes both in turn, so
  t = (N/L) · t_device + (1 − N/L) · t_host.
- **MoE experts on the host** (``cpu_moe=N``; llama.cpp ``--n-cpu-moe N`` /
  ``--cpu-moe``): the routed experts of N MoE layers live in host memory;
  attention, dense layers, shared experts and routers stay on the device
  (:func:`cpu_moe_time`).

Either way the host's speed, not the device's, usually sets the pace: a
consumer card moves ~1 TB/s from its own memory but ~25 GB/s over PCIe 4.0 and
~60-80 GB/s from dual-channel DDR5 — the "MoE on a 24 GB card is suddenly very
slow" case. All functions broadcast.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.traffic import expected_experts

NONE, STREAM, LAYERS = 0, 1, 2
OFFLOAD_MODES = {"none": NONE, "auto": STREAM, "layers": LAYERS}
# PCIe transfers of large pinned buffers reach ~80% of the link's per-direction peak
# (e.g. ~25 GB/s of 32 GB/s on PCIe 4.0 x16, NVIDIA bandwidthTest / nvbandwidth reports).
HOST_LINK_EFFICIENCY = 0.80


def device_weight_share(mode, gpu_layers, layers, weight_bytes, room_bytes):
    """Share of the weights kept on the device.

    Streaming keeps as much as fits beside the KV cache and workspace
    (``room_bytes``); partial offload keeps ``gpu_layers`` of ``layers``.
    """
    safe_weights = np.where(weight_bytes > 0, weight_bytes, 1.0)
    streaming = np.clip(room_bytes / safe_weights, 0.0, 1.0)
    by_layers = np.clip(gpu_layers / layers, 0.0, 1.0)
    return np.where(mode == STREAM, streaming, np.where(mode == LAYERS, by_layers, 1.0))


def streaming_time(weight_bytes_streamed, device_share, host_link_bytes_per_s):
    """Time to bring the off-device weights of one pass over the host link."""
    return (1.0 - device_share) * weight_bytes_streamed / (host_link_bytes_per_s * HOST_LINK_EFFICIENCY)


# llama.cpp's backend scheduler offloads an op whose weights live in host memory to the GPU once the
# batch reaches this many tokens, copying the weights over the host link (docs/formulas.md §8).
OFFLOAD_MIN_BATCH_TOKENS = 32
# llama.cpp's default micro-batch (n_ubatch); the weights cross once per micro-batch.
DEFAULT_UBATCH_TOKENS = 512


def cpu_moe_layers(cpu_moe, moe_layers):
    """MoE layers whose routed experts are in host memory: ``cpu_moe`` of them, at most all (``inf``: all)."""
    return np.clip(np.asarray(cpu_moe, dtype=float), 0.0, moe_layers)


def cpu_expert_bytes_stored(m, f, cpu_layers):
    """Bytes of the routed experts kept in host memory (every expert of those layers)."""
    return cpu_layers * m["experts"] * m["params_routed_one"] * f["expert_bits"] / 8


def cpu_expert_ledgers(m, f, cpu_layers, tokens):
    """Linear FLOPs and weight bytes the host-side experts account for in one pass over ``tokens`` tokens.

    FLOPs: 2 · P_e · k per token and layer; bytes: the expected distinct experts the tokens route to
    (:func:`estimator.physics.traffic.expected_experts`), as in the device's own ledger.
    """
    flops = 2 * m["params_routed_one"] * m["experts_per_token"] * cpu_layers * tokens
    touched = expected_experts(m["experts"], m["experts_per_token"], tokens)
    return flops, cpu_layers * touched * m["params_routed_one"] * f["expert_bits"] / 8


def cpu_moe_time(m, f, cpu_layers, tokens, host_rates, host_link_bytes_per_s, ubatch_tokens=DEFAULT_UBATCH_TOKENS):
    """Time the host-side experts add to one pass over ``tokens`` tokens, and whether the host CPU runs them.

    Assumptions (llama.cpp's ggml backend scheduler, docs/formulas.md §8):

    - below 32 tokens per pass (``GGML_OP_OFFLOAD_MIN_BATCH``; decode) the host CPU computes the experts
      of those layers from host memory, at its own effective rates: max(F_e / R_c,host, W_e / R_w,host)
      with W_e the expected distinct experts' bytes. The device runs everything else; the two take
      turns layer by layer (no overlap). Activations crossing the link (a few KB per layer) are ignored;
    - from 32 tokens on (prefill) the scheduler copies each host-resident expert tensor (all E experts
      of a layer, whatever the routing) to the device once per micro-batch of ``ubatch_tokens``
      (n_ubatch, 512 by default) and the device computes as if everything fitted; the copies, not
      overlapped, cost ⌈tokens / ubatch⌉ · W_stored / (0.80 · BW_host).

    Returns (seconds, mask of passes the host CPU computes).

    Examples
    --------
    One layer of 8 experts of 1e6 parameters at 8 bits, top-2, one token, a host reading 50 GB/s:

    >>> m = {"experts": 8, "experts_per_token": 2, "params_routed_one": 1e6}
    >>> rates = {"weight_bytes_per_s": 50e9, "linear_flops_per_s": 1e12}
    >>> t, on_cpu = cpu_moe_time(m, {"expert_bits": 8}, 1, 1, rates, 32e9)
    >>> round(float(t) * 1e6, 1), bool(on_cpu)       # 2 MB / 50 GB/s
    (40.0, True)
    """
    tokens = np.asarray(tokens, dtype=float)
    on_cpu = tokens < OFFLOAD_MIN_BATCH_TOKENS
    flops, bytes_read = cpu_expert_ledgers(m, f, cpu_layers, tokens)
    host_s = np.maximum(flops / host_rates["linear_flops_per_s"], bytes_read / host_rates["weight_bytes_per_s"])
    copies = np.ceil(tokens / ubatch_tokens)
    copy_s = copies * cpu_expert_bytes_stored(m, f, cpu_layers) / (host_link_bytes_per_s * HOST_LINK_EFFICIENCY)
    return np.where(on_cpu, host_s, copy_s), on_cpu
