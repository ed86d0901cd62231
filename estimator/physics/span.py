"""How many (query, key) pairs attention touches, with and without a sliding window.

Global layers attend to the whole context; local layers to at most the last
``W`` tokens (``min(S, W)``, docs/formulas.md §2). All functions broadcast.
"""

from __future__ import annotations

import numpy as np


def causal_pairs(T, W):
    """Pairs a causal prompt of T tokens scores: Σ_{i=1..T} min(i, W); W = 0 means no window.

    Examples
    --------
    A 4-token prompt attends to 1 + 2 + 3 + 4 = 10 pairs, or 1 + 2 + 2 + 2 = 7 with a window of 2:

    >>> float(causal_pairs(4, 0)), float(causal_pairs(4, 2))
    (10.0, 7.0)
    """
    T, W = np.asarray(T, dtype=float), np.asarray(W, dtype=float)
    full = T * (T + 1) / 2
    capped = W * (W + 1) / 2 + (T - W) * W
    return np.where((W > 0) & (T > W), capped, full)


def _integral_min(x, W):
    """∫_0^x min(s, W) ds."""
    return np.where(x <= W, x * x / 2, W * W / 2 + W * (x - W))


def mean_span(lo, hi, W):
    """Mean of min(S, W) for S uniform on [lo, hi]; W = 0 means no window (mean of S).

    Examples
    --------
    Context growing from 0 to 100 under a window of 50: half the time below, half at 50.

    >>> float(mean_span(0, 100, 50))
    37.5
    """
    lo, hi, W = (np.asarray(a, dtype=float) for a in (lo, hi, W))
    width = hi - lo
    no_window = (lo + hi) / 2
    safe_width = np.where(width > 0, width, 1.0)
    windowed = np.where(width > 0, (_integral_min(hi, W) - _integral_min(lo, W)) / safe_width, np.minimum(lo, W))
    return np.where(W > 0, windowed, no_window)


def decode_context_range(prompt_tokens, output_tokens):
    """Attended-context range over the decode steps, and the number of steps.

    The first output token comes from prefill; decode step j = 1 .. O-1 attends
    to P + j tokens (its own included). The range [P + ½, P + O - ½] has the
    same mean, P + O/2, as that discrete sequence. With O = 1 there are no decode
    steps and one step at context P + 1 is reported as the would-be speed.
    """
    P, O = np.asarray(prompt_tokens, dtype=float), np.asarray(output_tokens, dtype=float)
    steps = np.maximum(O - 1, 0)
    lo = P + 0.5
    hi = P + np.maximum(steps, 1) + 0.5
    return lo, hi, steps
