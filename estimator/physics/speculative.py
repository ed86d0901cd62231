"""Speculative decoding: a cheap draft proposes γ tokens, the target verifies them in one pass.

With per-token acceptance rate α (assumed independent, Leviathan et al. 2023,
arXiv 2211.17192, Eq. 1) a verification step yields on average

    E[n] = (1 − α^(γ+1)) / (1 − α)      (γ + 1 when α = 1)

tokens, the bonus token included. One speculative step costs γ draft steps plus
one target pass over γ + 1 tokens per sequence. That pass reads the weights and
the KV cache once, so while decode is memory-bound it costs about one ordinary
step and the speed-up approaches E[n] / (γ·c + 1) (Thm 3.8, c = draft cost over
target cost). As the batch grows, the (γ+1)-token pass turns compute-bound,
costs up to γ + 1 ordinary steps, and the speed-up shrinks or inverts
(docs/formulas.md §10). The estimator times the verify pass on the roofline rather
than assuming it costs one step.
"""

from __future__ import annotations

import numpy as np


def expected_tokens(alpha, gamma):
    """Expected tokens per verification step, E[n] = (1 − α^(γ+1)) / (1 − α).

    Examples
    --------
    With α = 0.8 and γ = 4 drafts, a step yields 3.36 tokens on average:

    >>> round(float(expected_tokens(0.8, 4)), 2)
    3.36
    """
    alpha, gamma = np.asarray(alpha, dtype=float), np.asarray(gamma, dtype=float)
    safe = np.where(alpha < 1, 1 - alpha, 1.0)
    return np.where(alpha < 1, (1 - alpha ** (gamma + 1)) / safe, gamma + 1)


def leviathan_speedup(alpha, gamma, cost_ratio):
    """The paper's walltime improvement when verifying costs one ordinary step (Thm 3.8).

    Examples
    --------
    A draft at 5 % of the target's cost, α = 0.8: γ = 1 gives 1.71x, γ = 4 gives 2.80x.

    >>> [round(float(leviathan_speedup(0.8, g, 0.05)), 2) for g in (1, 4)]
    [1.71, 2.8]
    """
    return expected_tokens(alpha, gamma) / (np.asarray(gamma) * cost_ratio + 1)
