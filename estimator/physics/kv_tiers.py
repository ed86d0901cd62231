"""A second KV-cache tier for prefix caching (LMCache-style): host memory or a local NVMe drive.

docs/formulas.md §14, "KV tiers". Prompt prefixes evicted from device memory are kept in the tier
(``--kv-offload cpu|disk --kv-offload-gib N``); a prefix-cache hit found there is copied back over the
host link (or read from the drive) instead of being recomputed. The cached prefixes live in the
device's free KV space G (what the running batch leaves) and in the tier's N bytes; with reuse spread
evenly over what is cached, a share N / (N + G) of the hits comes from the tier, and loading them costs

    t_load = N / (N + G) · hits · (KV bytes per token) / (tier read rate)

per prefill (no overlap with compute: an upper bound, since LMCache pipelines the loads by layer).
Running sequences keep their cache on the device: the tier adds prefix capacity, not batch capacity.
"""

from __future__ import annotations

import numpy as np

NONE, CPU, DISK = 0, 1, 2
TIERS = {"none": NONE, "cpu": CPU, "disk": DISK}
# A PCIe 4.0 x4 NVMe drive's sequential read: Samsung 990 PRO, up to 7,450 MB/s (Samsung's launch
# specification, August 2022). The drive serves one replica; its devices share it.
DISK_READ_BYTES_PER_S = 7.45e9


def tier_share(tier_bytes, free_device_bytes):
    """The share of prefix-cache hits found in the tier rather than in the device's free KV space."""
    tier_bytes = np.asarray(tier_bytes, dtype=float)
    return np.where(tier_bytes > 0, tier_bytes / (tier_bytes + np.maximum(free_device_bytes, 0.0)), 0.0)


def tier_load_time(hit_bytes, tier_bytes, free_device_bytes, tier_bytes_per_s):
    """Seconds one device spends copying its share of the hits' cache from the tier (all per device).

    Examples
    --------
    1,000 hit tokens of 128 KiB each, a 64 GiB tier beside 16 GiB free on the device, 25 GB/s: 80% of the
    hits load in about 4.2 ms.

    >>> round(float(tier_load_time(1000 * 131072, 64 * 2**30, 16 * 2**30, 25e9)) * 1e3, 2)
    4.19
    """
    return tier_share(tier_bytes, free_device_bytes) * np.asarray(hit_bytes, dtype=float) / tier_bytes_per_s
