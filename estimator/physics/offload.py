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

Either way the host's speed, not the device's, usually sets the pace: a
consumer card moves ~1 TB/s from its own memory but ~25 GB/s over PCIe 4.0 and
~60-80 GB/s from dual-channel DDR5 — the "MoE on a 24 GB card is suddenly very
slow" case. All functions broadcast.
"""

from __future__ import annotations

import numpy as np

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
