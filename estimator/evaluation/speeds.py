"""Latencies and rates of a run from its phase times: the identities of docs/conventions.md."""

from __future__ import annotations

import numpy as np


def phase_speeds(B, T, O, cached, prefill_s, itl_s, steps) -> dict:
    """TTFT, prefill and decode speeds, end-to-end latency and throughput of B sequences of T prompt (``cached`` of
    them from cache) and O output tokens, from the prefill time, the mean step time and the decode steps."""
    ttft_s = np.where(T > 0, prefill_s, 0.0)
    e2e_s = ttft_s + steps * itl_s
    return {
        "ttft_s": ttft_s, "prefill_tps": B * (T - cached) / np.where(ttft_s > 0, ttft_s, 1.0),
        "itl_s": itl_s, "decode_tps_per_seq": 1.0 / itl_s, "decode_tps_total": B / itl_s,
        "e2e_latency_s": e2e_s, "tpot_inclusive_s": e2e_s / O, "throughput_out_tps": B * O / e2e_s,
        "decode_steps": steps + 0 * itl_s,
    }
