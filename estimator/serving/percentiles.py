"""Latency percentiles under load: the distributions behind the steady-state means.

The engine is one server (docs/formulas.md §14, "Percentiles"). Prefills have priority:
at every step boundary the scheduler runs all queued prefills before the next decode
step (exhaustive service), and when no prompt waits it runs a decode step of
d = ITL(N). Seen from the prompts this is an M/G/1 queue with multiple vacations (the
decode steps), so the wait of a prompt is the M/G/1 wait plus the residual of the
decode step it arrived in, independent of each other (the Fuhrmann–Cooper
decomposition), and

    TTFT = own prefill + W + U,   U uniform on [0, d],
    P(W > t) ≈ ρ · exp(−t / m),   m = E[S] (1 + c_s²) / (2 (1 − ρ)),

the exponential tail whose mean is the Pollaczek–Khinchine wait ρ E[S] (1 + c_s²) /
(2 (1 − ρ)) and whose atom P(W = 0) = 1 − ρ is exact. Between two decode steps the
prefills that arrived during the step run, then those that arrived meanwhile: the count
K is the total progeny of a Poisson(λ d) generation with Poisson(ρ) offspring, a
generalised Poisson law (Consul), so ITL = d + K · S. Under chunked prefill a step
either carries a chunk (t_mix) or not (d). E2E adds O − 1 independent gaps to TTFT; its
p99 is a normal approximation of the sum. Everything is a pure function of arrays.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

PERCENTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
# Generalised-Poisson terms summed before the rest of the rows fall back to a normal law.
MAX_TERMS = 400
BISECTIONS = 60


def wait_tail_mean(rho, mean_service_s, service_scv=0.0):
    """Mean m of the exponential tail of the M/G/1 wait: P(W > t) ≈ ρ exp(−t/m).

    Notes
    -----
    m = E[S] (1 + c_s²) / (2 (1 − ρ)), so that E[W] = ρ m is the Pollaczek–Khinchine mean
    (docs/formulas.md §14). NaN when ρ ≥ 1 (no steady state).

    Examples
    --------
    What is the mean wait of an M/D/1 queue at 50% load and 1 s service?

    >>> 0.5 * float(wait_tail_mean(0.5, 1.0))
    0.5
    """
    rho = np.asarray(rho, dtype=float)
    return np.where(rho < 1, mean_service_s * (1 + np.asarray(service_scv, dtype=float))
                    / (2 * (1 - np.minimum(rho, 1 - 1e-12))), np.nan)


def wait_quantile(p: float, busy, tail_mean_s, step_s=0.0, service_s=0.0, cap_s=np.inf):
    """The p-quantile of service + W + U: P(W > t) = busy · exp(−t/m), U uniform on [0, step].

    Notes
    -----
    With G(x) = P(W + U > x) and θ = 1/m: for x ≥ d, G = busy · (m/d)(1 − e^{−d/m}) e^{−(x − d)/m}
    (solved in closed form); for x < d, G = (busy · m (1 − e^{−x/m}) + d − x) / d (bisection).
    The result is capped at ``cap_s`` (a closed loop cannot queue more than C − 1 prompts).

    Examples
    --------
    What is the median TTFT of a 20 ms prefill when nothing queues and steps last 10 ms?

    >>> round(float(wait_quantile(0.5, 0.0, 0.0, 0.010, 0.020)), 4)
    0.025
    """
    busy = np.clip(np.asarray(busy, dtype=float), 0.0, 1.0)
    m = np.maximum(np.asarray(tail_mean_s, dtype=float), 1e-300)
    d = np.maximum(np.asarray(step_s, dtype=float), 0.0)
    tail = 1.0 - p
    ratio = d / m
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        spread = np.where(ratio > 1e-12, -np.expm1(-ratio) / np.where(ratio > 0, ratio, 1.0), 1.0)
        g_at_d = busy * spread                                  # G(d), the probability W + U exceeds one step
        beyond = d + m * np.log(np.maximum(g_at_d / tail, 1.0))
        lo, hi = np.zeros_like(g_at_d * d), np.broadcast_to(d, np.shape(g_at_d * d)).copy()
        for _ in range(BISECTIONS):                             # G is decreasing on [0, d]
            mid = (lo + hi) / 2
            g = np.where(d > 0, (busy * m * -np.expm1(-mid / m) + d - mid) / np.where(d > 0, d, 1.0), 0.0)
            lo, hi = np.where(g > tail, mid, lo), np.where(g > tail, hi, mid)
        within = (lo + hi) / 2
    x = np.where(g_at_d > tail, beyond, within)
    x = np.where(busy * m > 0, x, p * d)                       # no queue: the residual step alone
    bad = ~np.isfinite(np.asarray(tail_mean_s, dtype=float)) | ~np.isfinite(busy)
    return np.where(bad, np.nan, np.minimum(service_s + x, cap_s))


def wait_moments(busy, tail_mean_s, step_s=0.0):
    """Mean and variance of W + U (the exponential-tail wait plus the residual step)."""
    busy = np.clip(np.asarray(busy, dtype=float), 0.0, 1.0)
    m = np.asarray(tail_mean_s, dtype=float)
    mean = busy * m + np.asarray(step_s, dtype=float) / 2
    var = 2 * busy * m ** 2 - (busy * m) ** 2 + np.asarray(step_s, dtype=float) ** 2 / 12
    return mean, var


def stall_count_quantile(p: float, arrivals_per_step, rho):
    """The p-quantile of K, the prefills that run between two decode steps.

    Notes
    -----
    K is the total progeny of a Poisson(a) first generation (a = λ d, the prompts that
    arrive during a decode step) with Poisson(ρ) offspring (those arriving during each
    prefill): the generalised Poisson law P(K = n) = a (a + nρ)^{n−1} e^{−a−nρ} / n!,
    mean a / (1 − ρ), variance a / (1 − ρ)³ (Consul and Jain 1973; docs/formulas.md §14).
    Exact for deterministic prefills; rows still short of p after ``MAX_TERMS`` terms take
    the normal quantile of that mean and variance.

    Examples
    --------
    How many prefills stall the median step when 0.1 prompts arrive per step at 20% load?

    >>> int(stall_count_quantile(0.5, 0.1, 0.2))
    0
    """
    a = np.asarray(arrivals_per_step, dtype=float)
    rho = np.asarray(rho, dtype=float)
    shape = np.broadcast(a, rho).shape
    a, rho = np.broadcast_to(a, shape), np.broadcast_to(rho, shape)
    cdf = np.exp(-a)
    k = np.where(cdf >= p, 0.0, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_a = np.log(a)
        for n in range(1, MAX_TERMS + 1):
            if not np.isnan(k).any():
                break
            log_pmf = log_a + (n - 1) * np.log(a + n * rho) - a - n * rho - math.lgamma(n + 1)
            cdf = cdf + np.where(a > 0, np.exp(log_pmf), 0.0)
            k = np.where(np.isnan(k) & (cdf >= p), float(n), k)
        mean, sd = a / (1 - rho), np.sqrt(a / (1 - rho) ** 3)
        fallback = np.ceil(mean + NormalDist().inv_cdf(p) * sd)
    return np.where(np.isnan(k) & (rho < 1), fallback, np.where(rho < 1, k, np.nan))


def itl_quantile(p: float, step_s, stall_s, arrivals_per_step, rho):
    """Whole-prompt prefill: the p-quantile of the gap between tokens, d + K · S.

    Examples
    --------
    A 10 ms step, 20 ms prefills, one prompt every ten steps at 20% load: the p99 gap?

    >>> round(float(itl_quantile(0.99, 0.010, 0.020, 0.1, 0.2)), 3)
    0.05
    """
    return step_s + stall_count_quantile(p, arrivals_per_step, rho) * stall_s


def _normal_tail(z):
    """P(Z > z) for a standard normal Z, vectorized (Abramowitz and Stegun 7.1.26, error below 1.5e-7)."""
    x = np.abs(np.asarray(z, dtype=float)) / math.sqrt(2)
    t = 1 / (1 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    half_erfc = 0.5 * poly * np.exp(-x * x)
    return np.where(np.asarray(z) >= 0, half_erfc, 1 - half_erfc)


def stall_time_quantile(p: float, arrivals_per_step, rho, mean_s, scv):
    """The p-quantile of the time K prefills of random length take between two decode steps.

    Notes
    -----
    P(Σ_{j≤K} S_j > x) = Σ_k P(K = k) P(Σ_{j≤k} S_j > x), K generalised Poisson as in
    :func:`stall_count_quantile`, and the sum of k prefills normal with mean k E[S] and variance
    k c_s² E[S]² (docs/formulas.md §14, "Request lengths"); solved by bisection. With c_s² = 0 it is
    K_p · E[S].

    Examples
    --------
    Prompts of random length stretch the p99 stall beyond the count's p99 times the mean prefill:

    >>> alike = float(stall_count_quantile(0.99, 0.1, 0.2)) * 0.020
    >>> alike < float(stall_time_quantile(0.99, 0.1, 0.2, 0.020, 1.0))
    True
    """
    a, rho, mean_s, scv = np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in
                                                (arrivals_per_step, rho, mean_s, scv)))
    ks = np.arange(1, MAX_TERMS + 1, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_pmf = (np.log(a)[..., None] + (ks - 1) * np.log(a[..., None] + ks * rho[..., None]) - a[..., None]
                   - ks * rho[..., None] - np.array([math.lgamma(k + 1) for k in ks]))
        pmf = np.where(a[..., None] > 0, np.exp(log_pmf), 0.0)
    sd = np.sqrt(ks * scv[..., None]) * mean_s[..., None]

    def tail(x):
        z = (x[..., None] - ks * mean_s[..., None]) / np.maximum(sd, 1e-300)
        return np.sum(pmf * _normal_tail(z), axis=-1)

    low = np.zeros_like(a)
    high = (a / np.maximum(1 - rho, 1e-9) + 10 * np.sqrt(a / np.maximum(1 - rho, 1e-9) ** 3) + 10) * mean_s \
        * (1 + 4 * np.sqrt(scv))
    for _ in range(BISECTIONS):
        mid = (low + high) / 2
        beyond = tail(mid) > 1 - p
        low, high = np.where(beyond, mid, low), np.where(beyond, high, mid)
    return np.where(rho < 1, high, np.nan)


def chunked_itl_quantile(p: float, step_s, mixed_step_s, mixed_share):
    """Chunked prefill: a share f of steps carries a chunk and lasts t_mix, the rest d."""
    return np.where(p > 1 - np.clip(mixed_share, 0.0, 1.0), mixed_step_s, step_s)


def normal_quantile(p: float, mean, var):
    """mean + z_p · sd: the normal approximation used for E2E (a sum of O − 1 gaps and TTFT)."""
    return mean + NormalDist().inv_cdf(p) * np.sqrt(np.maximum(var, 0.0))


def serving_percentiles(closed, in_flight, X, prefill_s, service_s, step_s, mean_step_s, steps, prompt_tokens,
                        chunk_free, t_mix, closed_wait_s, prefill_scv=0.0) -> dict:
    """TTFT, ITL and E2E percentiles of the steady state (columns ``ttft_p50_s`` … ``e2e_p99_s``).

    Parameters
    ----------
    closed : bool array
        Closed loop (a concurrency) rather than open loop (a rate).
    in_flight : array
        C' = max(min(C, N_max), 1), requests in flight in a closed loop.
    X : array
        Request throughput (requests/s).
    prefill_s, service_s : array
        One prompt's prefill alone; its service once started (whole, or ⌈P/(K − N)⌉ mixed steps).
    step_s, mean_step_s : array
        ITL(N), a decode step without prefill; t_step, the mean gap with prefill stalls.
    steps : array
        O − 1 decode steps per request.
    prompt_tokens, chunk_free, t_mix : array
        P; K − N prompt tokens per mixed step (0 without chunked prefill); a mixed step's time.
    closed_wait_s : array
        The mean-value-analysis wait for prefill in a closed loop (R_pf − t_pf).
    prefill_scv : array
        Squared coefficient of variation c_s² of the prefill time (0: every prompt alike).

    Notes
    -----
    docs/formulas.md §14, "Percentiles". Open loop: busy = ρ = X E[S], tail mean m as in
    :func:`wait_tail_mean`. Closed loop: busy = u (C' − 1)/C' (an arrival sees the other
    C' − 1 requests), m = W_MVA / busy, and the wait is capped at (C' − 1) E[S] + d.
    NaN where the prompt queue has no steady state (ρ ≥ 1).
    """
    with np.errstate(over="ignore", invalid="ignore"):   # an unstable row overflows, then becomes NaN below
        return _serving_percentiles(closed, in_flight, X, prefill_s, service_s, step_s, mean_step_s, steps,
                                    prompt_tokens, chunk_free, t_mix, closed_wait_s, prefill_scv)


def _serving_percentiles(closed, in_flight, X, prefill_s, service_s, step_s, mean_step_s, steps, prompt_tokens,
                         chunk_free, t_mix, closed_wait_s, prefill_scv) -> dict:
    chunked = chunk_free > 0
    queue_service = np.where(chunked, prompt_tokens * t_mix / np.maximum(chunk_free, 1.0), prefill_s)
    rho = X * queue_service
    scale = queue_service / np.maximum(prefill_s, 1e-300)
    closed_busy = np.minimum(rho, 1.0) * (in_flight - 1) / in_flight
    busy = np.where(closed, closed_busy, rho)
    tail_mean = np.where(closed, closed_wait_s * scale / np.maximum(closed_busy, 1e-12),
                         wait_tail_mean(rho, queue_service, prefill_scv))
    tail_mean = np.where(closed & (closed_busy <= 0), 0.0, tail_mean)
    cap = np.where(closed, service_s + (in_flight - 1) * queue_service + step_s, np.inf)
    out = {f"ttft_{name}_s": wait_quantile(p, busy, tail_mean, step_s, service_s, cap)
           for name, p in PERCENTILES.items()}
    # prefill stalls between two decode steps: a = X d prompts arrive in a step, ρ per prefill
    stall_rho = np.where(closed, np.minimum(X * prefill_s, 0.99), X * prefill_s)
    arrivals = X * step_s
    varied = np.any(np.asarray(prefill_scv) > 0)
    for name, p in PERCENTILES.items():
        whole = step_s + np.minimum(stall_count_quantile(p, arrivals, stall_rho),
                                    np.where(closed, in_flight, np.inf)) * prefill_s
        if varied:   # prompts of different lengths: the stall is a sum of random prefills
            whole = np.where(np.asarray(prefill_scv) > 0, step_s + np.minimum(
                stall_time_quantile(p, arrivals, stall_rho, prefill_s, prefill_scv),
                np.where(closed, in_flight, np.inf) * prefill_s), whole)
        mixed_share = X * prompt_tokens * mean_step_s / np.maximum(chunk_free, 1.0)
        out[f"itl_{name}_s"] = np.where(chunked, chunked_itl_quantile(p, step_s, t_mix, mixed_share), whole)
    wait_mean, wait_var = wait_moments(busy, tail_mean, step_s)
    stalls = arrivals / (1 - np.minimum(stall_rho, 0.999))
    gap_var = np.where(chunked, np.clip(mixed_share, 0, 1) * (1 - np.clip(mixed_share, 0, 1)) * (t_mix - step_s) ** 2,
                       prefill_s ** 2 * (stalls / (1 - np.minimum(stall_rho, 0.999)) ** 2 + prefill_scv * stalls))
    # E2E = TTFT + O − 1 gaps, independent (each stall clears the queue): a normal approximation of the sum
    e2e = normal_quantile(PERCENTILES["p99"], service_s + wait_mean + steps * mean_step_s, wait_var + steps * gap_var)
    out["e2e_p99_s"] = np.maximum(e2e, out["ttft_p99_s"] + steps * step_s)
    unstable = ~np.isfinite(mean_step_s) | (np.where(closed, 0.0, rho) >= 1)
    return {k: np.where(unstable, np.nan, v) for k, v in out.items()}
