"""A small discrete-event simulation of one serving engine, to check the queueing model.

One server runs either a prefill or a decode step of the running batch (docs/formulas.md §14,
"Percentiles"). Whole-prompt prefill has priority: at every step boundary the queued prompts
are prefilled, one after another, before the next decode step. With a token budget K per
step (chunked prefill) every step carries the N decode tokens and up to K − N prompt tokens
taken first come, first served, and costs max(ITL(N), (N + prompt tokens) · t_tok). A
prefilled request gives its first token, then joins the batch for O − 1 decode steps.

Arrivals are Poisson (a rate) or closed loop (a concurrency: the first C requests arrive
spread uniformly over one cycle, or all at t = 0 as a benchmark client sends them, and a finished
request is replaced after a client delay drawn uniformly over one decode step, so the replacement
lands at a random point of a step). The run is bounded: ``requests`` arrivals, ``max_events`` server
actions and ``max_wall_s`` seconds, whichever ends first; the seed fixes the result. It is a
test instrument, not part of the estimate.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable

import numpy as np


def simulate(itl_at: Callable, prefill_s, prompt_tokens, output_tokens, *, rate: float = 0.0,
             concurrency: int = 0, chunk_tokens: int = 0, requests: int = 20_000, warmup: float = 0.1, seed: int = 0,
             max_events: int = 3_000_000, max_wall_s: float = 30.0, start_together: bool = False) -> dict:
    """Simulate ``requests`` arrivals; return TTFT, ITL and E2E samples of the measured window.

    ``prefill_s``, ``prompt_tokens`` and ``output_tokens`` are one request's, or arrays of a length
    mix's requests (each arrival draws one of them uniformly; whole-prompt prefill only).
    ``start_together``: a closed loop's first C requests all arrive at t = 0, as a benchmark client sends them.

    Returns a dict of arrays ``ttft_s``, ``e2e_s`` (requests after the first ``warmup`` share),
    ``itl_s`` (every gap between tokens from the first measured arrival to the last arrival),
    ``mean_batch``, ``duration_s`` (when the last request ended) and ``truncated`` (True when a bound other
    than ``requests`` ended the run).
    """
    rng = np.random.default_rng(seed)
    mixed = np.ndim(prompt_tokens) > 0
    if mixed and chunk_tokens > 0:
        raise ValueError("a length mix is simulated with whole-prompt prefill only")
    prompts, outputs, prefills = (np.atleast_1d(np.asarray(v, dtype=float)) for v in (prompt_tokens, output_tokens,
                                                                                     prefill_s))
    kind = np.random.default_rng(seed + 1).integers(0, len(prompts), requests) if mixed else \
        np.zeros(requests, dtype=np.int64)     # a separate stream: arrivals stay those of a fixed-length run
    steps_of = np.maximum(outputs - 1, 1).astype(np.int64)
    steps = float(steps_of.mean())
    per_token_s = float(prefills[0] / max(prompts[0], 1))
    pending: list = []                                     # heap of (arrival time, id)
    if rate > 0:
        times = np.cumsum(rng.exponential(1.0 / rate, requests))
        pending = [(float(t), i) for i, t in enumerate(times)]
        issued = requests
    else:
        # the first requests spread over one cycle, so that fixed lengths do not keep them in lockstep
        cycle = steps * float(itl_at(np.array(float(concurrency)))) + concurrency * float(prefills.mean())
        starts = np.zeros(concurrency) if start_together else np.sort(rng.uniform(0, cycle, concurrency))
        pending = [(float(t), i) for i, t in enumerate(starts)]
        issued = concurrency
    heapq.heapify(pending)
    warm_id = int(warmup * requests)
    arrival = np.full(requests, np.nan)
    first = np.full(requests, np.nan)
    done = np.full(requests, np.nan)
    queue: deque = deque()                                 # [id, prompt tokens left]
    ids = np.empty(0, dtype=np.int64)
    left = np.empty(0, dtype=np.int64)
    last = np.empty(0)
    gaps, batch_sizes = [], []
    t, t_warm, t_end = 0.0, np.inf, np.inf
    clock, events, truncated = time.monotonic(), 0, False

    while True:
        while pending and pending[0][0] <= t:
            at, i = heapq.heappop(pending)
            arrival[i] = at
            queue.append([i, int(prompts[kind[i]])])
            t_warm = at if i == warm_id else t_warm
            t_end = at if i == requests - 1 else t_end
        if not queue and not len(ids):
            if not pending:
                break
            t = pending[0][0]
            continue
        events += 1
        if events > max_events or (events % 4096 == 0 and time.monotonic() - clock > max_wall_s):
            truncated = True
            break
        joined = []
        if chunk_tokens <= 0 and queue:                    # whole prompt, before any decode step
            i, _ = queue.popleft()
            t += float(prefills[kind[i]])
            joined.append(i)
        else:
            n = len(ids)
            budget, used = max(chunk_tokens - n, 1), 0
            while queue and used < budget:
                take = min(queue[0][1], budget - used)
                queue[0][1] -= take
                used += take
                if queue[0][1] == 0:
                    joined.append(queue.popleft()[0])
            step = float(itl_at(np.array(float(max(n, 1)))))
            t += max(step, (n + used) * per_token_s) if used else step
            if n:
                if t_warm <= t <= t_end:
                    gaps.append(t - last)
                    batch_sizes.append(n)
                last[:] = t
                left -= 1
                finished = left == 0
                if finished.any():
                    for i in ids[finished]:
                        done[i] = t
                        if concurrency and issued < requests:
                            heapq.heappush(pending, (t + rng.uniform(0, step), issued))
                            issued += 1
                    ids, left, last = ids[~finished], left[~finished], last[~finished]
        if joined:
            first[joined] = t
            ids = np.concatenate([ids, joined])
            left = np.concatenate([left, steps_of[kind[joined]]])
            last = np.concatenate([last, np.full(len(joined), t)])
    measured = np.arange(requests) >= warm_id
    ok = measured & np.isfinite(first)
    return {"ttft_s": (first - arrival)[ok], "e2e_s": (done - arrival)[measured & np.isfinite(done)],
            "itl_s": np.concatenate(gaps) if gaps else np.empty(0),
            "mean_batch": float(np.mean(batch_sizes)) if batch_sizes else 0.0, "truncated": truncated,
            "duration_s": float(np.nanmax(done)) if np.isfinite(done).any() else 0.0,
            "request_rate": float(np.sum(np.isfinite(done)) / t) if t > 0 else 0.0}


def percentiles(samples: dict, quantiles=(50, 90, 99)) -> dict:
    """``ttft_p50_s`` … ``itl_p99_s`` and ``e2e_p99_s`` of a :func:`simulate` run, named like the model's."""
    out = {f"{k}_p{q}_s": float(np.percentile(samples[f"{k}_s"], q)) for k in ("ttft", "itl") for q in quantiles}
    out["e2e_p99_s"] = float(np.percentile(samples["e2e_s"], 99))
    return out
