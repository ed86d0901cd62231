"""Continuous batching under load: the steady state of a serving engine.

Requests of P prompt and O output tokens arrive at a rate R (open loop) or are
kept at a fixed concurrency C (closed loop: a finished request is replaced at
once). With continuous batching (Orca, vLLM) each request is prefilled, then
joins the running decode batch for its O − 1 remaining tokens. In steady state:

- Little's law on the decode phase: N = X · (O − 1) · t_step, where X is the
  request throughput (X = R open loop; X = C / E2E closed loop) and N the
  decode batch.
- Whole-prompt prefill stalls the running batch: per second X prefills of
  t_pf each, so a decode step takes t_step = ITL(N) / (1 − X · t_pf).
- Chunked prefill with a token budget K per step (vLLM ``max_num_batched_tokens``,
  docs/formulas.md §5) mixes K − N prompt tokens into a step of N decode tokens. A
  mixed step costs t_mix = max(ITL(N), (N + K − N) · t_tok), with t_tok the
  prefill time per prompt token; a share f = X · P · t_step / (K − N) of steps
  carry prompt tokens, so t_step = ITL / (1 − X · P · (t_mix − ITL) / (K − N)),
  and a prompt needs ⌈P / (K − N)⌉ mixed steps (servcalc). The roofline
  underestimates prefill-decode interference in mixed steps (BLIS #949).
- Open loop, prompts queue for prefill as in an M/D/1 queue with utilisation
  u = X · t_pf: wait = u · t_pf / (2 (1 − u)), plus half a decode step to reach a
  step boundary. Closed loop, the queue is solved by mean-value analysis.
- The engine runs at most S = min(N_kv, max_num_seqs) sequences at once: the KV
  cache's capacity and the scheduler's cap (vLLM ``max_num_seqs``). Closed loop, the
  C − S clients beyond it wait for a slot: by Little's law on that waiting line,
  each waits (C − S) / X before its prefill starts. Open loop, a decode batch
  beyond S means the queue grows without bound.
- Percentiles of TTFT, ITL and E2E come from the distributions behind these means
  (:mod:`estimator.serving.percentiles`).

The fixed point is found by damped iteration. A steady state cannot exist when
u ≥ 1 (prompts arrive faster than they can be prefilled) or when the decode
batch it needs exceeds the KV-cache capacity: such configurations are flagged
``saturated`` instead of reported as if they could run.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from estimator.serving.mixed_steps import MAX_UTILISATION, MixedSteps
from estimator.serving.percentiles import PERCENTILES, serving_percentiles

ITERATIONS = 40
DAMPING = 0.5


def _step_time(itl, X, prefill_s, prompt_tokens, chunk_free, t_mix):
    """Mean decode-step time under prefill interference; inf when prompts cannot keep up."""
    whole_prompt_load = X * prefill_s
    chunk_load = X * prompt_tokens * (t_mix - itl) / np.maximum(chunk_free, 1.0)
    load = np.where(chunk_free > 0, chunk_load, whole_prompt_load)
    return np.where(load < MAX_UTILISATION, itl / (1 - np.minimum(load, MAX_UTILISATION)), np.inf)


def steady_state(itl_at: Callable, prefill_s, prompt_tokens, output_tokens, concurrency, rate, max_batch,
                 chunk_tokens=0.0, prefill_scv=0.0, max_num_seqs=np.inf, mixed: MixedSteps | None = None,
                 launch_excess_s=0.0) -> dict:
    """Steady-state decode batch, latencies and throughput under load.

    Parameters
    ----------
    itl_at : callable
        ITL(N): decode step time at a decode batch of N (array in, array out).
    prefill_s : array
        Time to prefill one prompt alone.
    launch_excess_s : array
        What launching that prefill from Python adds to it (``prefill_launch_excess_s``): each prompt's own first
        token waits for it, but prompts that queue are prefilled together and share it, so the prefill queue and
        the decode steps it stalls are charged the prefill without it.
    concurrency, rate : array
        Closed-loop concurrency C, or open-loop request rate R (req/s); the other is 0.
    max_batch : array
        Largest batch whose KV cache fits.
    max_num_seqs : array
        The scheduler's cap on sequences per step (inf: none beyond the KV cache).
    chunk_tokens : array
        Token budget per step for chunked prefill; 0 prefills whole prompts.
    mixed : MixedSteps, optional
        The engine runs arriving prompts inside its decode steps (without an explicit ``chunk_tokens``):
        a step's time is :meth:`MixedSteps.steady_step_s` instead of a decode step stalled by whole prompts.
    prefill_scv : array
        Squared coefficient of variation of the prefill time (0 while every request has the
        same lengths); it widens the queue's tail (:mod:`estimator.serving.percentiles`).

    Notes
    -----
    Open loop: X = R and the prefill queue is M/D/1. Closed loop: C requests
    circulate between the prefill queue (service t_pf) and decoding (a delay of
    (O − 1) · t_step); the queue is solved by Schweitzer's approximate mean-value
    analysis, R_pf = t_pf (1 + Q (C − 1) / C), X = C / (R_pf + (O − 1) t_step),
    Q = X R_pf, over the C' = min(C, S) requests the engine admits (S slots); the other
    C − C' wait (C − C') / X for a slot. A closed loop never saturates (throughput
    self-limits); an open loop saturates when prompts arrive faster than they can be
    prefilled or the decode batch it needs exceeds S.
    """
    steps = np.maximum(np.asarray(output_tokens, dtype=float) - 1, 1.0)
    C = np.asarray(concurrency, dtype=float)
    closed = C > 0
    held_s = prefill_s - launch_excess_s   # what a prompt holds the prefill for among others
    per_token_s = held_s / np.maximum(prompt_tokens, 1)
    slots = np.maximum(np.minimum(max_batch, max_num_seqs), 1)
    in_flight = np.maximum(np.minimum(C, slots), 1)
    N = np.where(closed, in_flight,
                 np.maximum(rate * steps * itl_at(np.ones_like(steps)), 1.0))
    X, queue = np.where(closed, 0.0, rate), np.zeros_like(N)
    finite_step = np.zeros_like(N)        # the step before the first: no prompts yet to hide the decode under
    queue_s = held_s                      # the time a prompt holds the prefill: its whole prefill …
    if mixed is not None:                 # … or its tokens' share of the mixed steps
        mixing = np.asarray(chunk_tokens) <= 0
        queue_s = np.where(mixing, prompt_tokens * mixed.token_s, held_s)
    for _ in range(ITERATIONS):
        N = np.clip(N, 1.0, np.where(closed, in_flight, np.inf))
        itl = itl_at(N)
        chunk_free = np.where(chunk_tokens > 0, np.maximum(chunk_tokens - N, 1.0), 0.0)
        t_mix = np.maximum(itl, (N + chunk_free) * per_token_s)
        t_step = _step_time(itl, X, held_s, prompt_tokens, chunk_free, t_mix)
        if mixed is not None:
            t_step = np.where(chunk_free > 0, t_step, mixed.steady_step_s(itl, X, prompt_tokens, N, finite_step))
        finite_step = np.where(np.isfinite(t_step), t_step, itl)
        response = queue_s * (1 + queue * (in_flight - 1) / in_flight)          # Schweitzer MVA
        X_closed = in_flight / (response + steps * finite_step)
        queue = X_closed * response
        X = np.where(closed, DAMPING * X + (1 - DAMPING) * X_closed, rate)
        N = DAMPING * N + (1 - DAMPING) * np.where(np.isfinite(t_step), X * steps * t_step, 1e9)
    service = _service(prefill_s, prompt_tokens, chunk_free, t_mix)
    if mixed is not None:   # a prompt's first token comes with the step that carries it, which does all the
        # prompt's own work: never sooner than the prompt alone (t_tok, a full step's share, leaves out the fixed
        # costs and weights the step pays for one prompt: for a MoE model, the experts it touches beyond the decode's)
        service = np.where(mixing, np.maximum(mixed.step_with(itl, prompt_tokens, N) + launch_excess_s, prefill_s),
                           service)
    slot_wait = np.where(closed, np.maximum(C - in_flight, 0.0) / np.maximum(X, 1e-300), 0.0)
    ttft = np.where(closed, slot_wait + response - queue_s + service + finite_step / 2,
                    _ttft(service, queue_s, finite_step, X, prefill_scv))
    saturated = np.where(closed, False, ~np.isfinite(t_step) | (N > slots))
    percentiles = serving_percentiles(closed, in_flight, X, queue_s, service, itl, t_step, steps, prompt_tokens,
                                      chunk_free, t_mix, response - queue_s, prefill_scv)
    if mixed is not None:   # a gap between two tokens is one step, carrying the prompts that arrived meanwhile
        percentiles.update({f"itl_{name}_s": np.where(mixing, mixed.gap_quantile_s(itl, X * finite_step, prompt_tokens,
                                                                                   N, p), percentiles[f"itl_{name}_s"])
                            for name, p in PERCENTILES.items()})
    # the wait for a slot: C − C' departures of a full engine, nearly regular, so a shift of every percentile
    percentiles = {k: np.where(saturated, np.nan, v + (0.0 if k.startswith("itl") else slot_wait))
                   for k, v in percentiles.items()}
    return {"steady_batch": N, "itl_s": t_step, "ttft_s": ttft, "request_rate": X, "saturated": saturated,
            "queued_requests": np.maximum(C - in_flight, 0.0), "slots": slots, **percentiles}


def _service(prefill_s, prompt_tokens, chunk_free, t_mix):
    """Time a prompt takes to prefill once it starts: whole, or over ⌈P / (K − N)⌉ mixed steps."""
    chunked = np.ceil(prompt_tokens / np.maximum(chunk_free, 1.0)) * t_mix
    return np.where(chunk_free > 0, chunked, prefill_s)


def _ttft(service_s, queue_s, t_step, X, prefill_scv=0.0):
    """Open loop: the prompt's service (whole, in chunks, or in the mixed step that carries it), the M/G/1
    queue for the prefill, each prompt holding it ``queue_s`` (Pollaczek–Khinchine: M/D/1 when every prompt
    is alike, c_s² = 0), and half a step to the next boundary."""
    u = np.minimum(X * queue_s, MAX_UTILISATION)
    return service_s + u * queue_s * (1 + prefill_scv) / (2 * (1 - u)) + t_step / 2


def backlog_wait_s(requests, rate, capacity, slots, quantile=None):
    """A finite open-loop benchmark offered more than the engine serves: the wait its backlog adds.

    Notes
    -----
    ``requests`` n arrive at ``rate`` R above the sustainable rate μ (``capacity``). The engine admits
    up to S (``slots``) sequences and serves μ requests/s, so by the arrival of request i (at i/R) it
    has finished about i μ/R of them and i (1 − μ/R) are in the system; request i waits for a slot
    W_i = max(0, i a − S/μ), a = 1/μ − 1/R (docs/formulas.md §14, "Finite benchmarks"). With
    ``quantile`` q: W at i = q n; without: the mean over i = 0 … n, a (n − i₀)² / (2n),
    i₀ = S / (μ a). 0 when R ≤ μ, when n is 0 (an endless steady state), or when the engine holds
    the whole backlog (its ITL grows instead: the steady state at capacity).

    Examples
    --------
    500 requests offered at 32/s to an engine that serves 14/s and runs 100 at once: the mean waits 4.2 s.

    >>> round(float(backlog_wait_s(500, 32.0, 14.0, 100)), 1)
    4.2
    """
    R, mu, n, S = (np.asarray(v, dtype=float) for v in (rate, capacity, requests, slots))
    a = np.where((R > mu) & (n > 1), 1 / np.maximum(mu, 1e-300) - 1 / np.maximum(R, 1e-300), 0.0)
    with np.errstate(over="ignore"):   # a tiny μ or a: nobody waits, the first waiting request is past n
        first = np.minimum(S / np.maximum(mu, 1e-300) / np.where(a > 0, a, 1.0), n)    # the first that waits
    if quantile is not None:
        return np.where(a > 0, np.maximum(quantile * n * a - S / np.maximum(mu, 1e-300), 0.0), 0.0)
    return np.where(a > 0, a * (n - first) ** 2 / (2 * np.maximum(n, 1.0)), 0.0)


def max_sustainable_rate(itl_at_max, prefill_s, output_tokens, max_batch):
    """Request rate at which the decode batch reaches the KV-cache capacity (whole-prompt prefill).

    From N = X (O − 1) t_step and t_step = ITL(N) / (1 − X t_pf) at N = N_max.
    """
    steps = np.maximum(np.asarray(output_tokens, dtype=float) - 1, 1.0)
    return max_batch / (steps * itl_at_max + max_batch * prefill_s)
