"""How a finite open-loop benchmark ends: its last replies decode in a thinning batch.

A benchmark of n requests offered at a rate (``--num-requests`` with ``--rate``) reports its output
tokens over its duration. Its last request arrives (or, behind a backlog, starts) at A = (n − 1)/X;
the run then lasts until the reply with the most tokens left ends, and no prompts arrive any more, so
the batch thins as replies end and the last steps run at the pace of a nearly empty engine
(docs/formulas.md §14, "Finite benchmarks").

At A the requests in the system arrived at X a second and decoded at t a step, so those with more
than k tokens left number n(k) = X t E[(o − k)⁺] (o a request's decode steps, O − 1; no more than the run's
n requests in all, a cap that binds when n is below the steady batch); the run ends
when the last of them does, at k* where n(k*) = ln 2 (the count above k* is Poisson: the median of the
largest residual), and no earlier than the last request's own median reply. Step k of the tail runs
n(k) sequences, a decode step affine in them between one sequence and the steady batch b (weights
stream once a step, KV reads and per-sequence costs grow with the batch, as in
:mod:`estimator.serving.burst`):

    duration = A + TTFT + ∫₀^k* d(max(n(k), 1)) dk,   d(n) = d₁ + (d_b − d₁)(n − 1)/(b − 1)

The outputs are one equal length O − 1 for every request, or a length mix's: E[(o − k)⁺] is tabulated
once on the outputs divided by a scale (O − 1, or 1 for a mix), so every configuration shares it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

GRID_POINTS = 257          # residual lengths at which E[(o − k)⁺] is tabulated (exact for equal lengths)


@dataclass(frozen=True)
class Residuals:
    """E[(o − k)⁺] of decode steps o, in units of ``scale``: on the grid u = k / scale."""

    u: np.ndarray            # increasing, 0 … the longest output
    left: np.ndarray         # e(u) = E[(o − u)⁺], non-increasing
    left_integral: np.ndarray   # ∫₀^u e
    median: float            # the median output, a request's own reply

    @classmethod
    def of(cls, outputs: np.ndarray) -> Residuals:
        o = np.sort(np.asarray(outputs, dtype=float))
        u = np.linspace(0.0, max(float(o[-1]), 1e-9), GRID_POINTS)
        # E[(o − u)⁺] = (the sum of the outputs above u − u · their count) / m, from sorted running sums
        above = np.searchsorted(o, u, side="right")
        tail_sums = np.concatenate((np.cumsum(o[::-1])[::-1], [0.0]))
        left = (tail_sums[above] - u * (o.size - above)) / o.size
        steps = np.diff(u) * (left[1:] + left[:-1]) / 2       # e is piecewise linear between sample points
        return cls(u, left, np.concatenate(([0.0], np.cumsum(steps))), float(np.median(o)))

    def where_left(self, value):
        """u at which e(u) falls to ``value`` (0 where e(0) is below it)."""
        return np.interp(value, self.left[::-1], self.u[::-1])


def finite_run_s(requests, request_rate, step_s, first_token_s, step_one_s, step_batch_s, batch,
                 residuals: Residuals, scale, last_start_s=None):
    """Duration of a run of ``requests`` (per replica) served at ``request_rate`` X in steps of ``step_s``
    t, whose last request's first token takes ``first_token_s``; decode steps take ``step_one_s`` at one
    sequence and ``step_batch_s`` at ``batch`` b. ``residuals`` tabulates the decode steps over ``scale``.
    ``last_start_s``: when the last request starts, (n − 1)/X for arrivals at a rate unless given (a closed
    loop's: :func:`~estimator.serving.first_wave.last_start_s`).

    Examples
    --------
    200 requests at 16 a second with 100 decode steps each, 20 ms a step (10 ms alone, 20 ms at 32): the
    last arrives at 12.44 s, and its reply, with fewer and fewer beside it, ends 1.48 s after its first token
    (2 s at the full batch's pace).

    >>> r = Residuals.of(np.array([1.0]))
    >>> round(float(finite_run_s(200, 16.0, 0.02, 0.05, 0.01, 0.02, 32.0, r, 100.0)), 2)
    13.97
    """
    X = np.maximum(np.asarray(request_rate, dtype=float), 1e-300)
    scale = np.maximum(np.asarray(scale, dtype=float), 1e-300)
    # n(k) = per_scale · e(k / scale): never more than the run's requests, and floored so that a near-idle
    # engine's divisions stay finite (u = 0 either way)
    requests = np.asarray(requests, dtype=float)
    per_scale = np.maximum(np.minimum(X * np.asarray(step_s, dtype=float) * scale, requests / residuals.left[0]), 1e-12)
    last = np.maximum(residuals.where_left(math.log(2) / per_scale), residuals.median)
    busy = np.minimum(residuals.where_left(1.0 / per_scale), last)   # where more than one sequence runs
    above_one = scale * (per_scale * np.interp(busy, residuals.u, residuals.left_integral) - busy)
    b = np.asarray(batch, dtype=float)
    slope = np.where(b > 1, (np.asarray(step_batch_s) - step_one_s) / np.maximum(b - 1, 1e-300), 0.0)
    tail_s = step_one_s * scale * last + slope * np.maximum(above_one, 0.0)
    start_s = (requests - 1) / X if last_start_s is None else last_start_s
    return start_s + first_token_s + tail_s
