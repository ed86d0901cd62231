"""Skewed expert routing: fewer distinct experts per step, and a busiest expert-parallel rank.

Real routers do not spread tokens evenly: a few experts take a large share. The skew is a Zipf
law over the E experts ranked by popularity, p_i ∝ i^(−s) (s = 0: uniform, the default;
docs/formulas.md §4, "MoE: expected unique experts per step", and §8). With k experts per token, expert i is
chosen by a token with probability π_i = k p_i, capped at 1 (top-k picks an expert at most once)
with the excess spread over the others so that Σ π_i = k. Then, for ``tokens`` tokens in a pass:

- distinct experts read: Σ_i [1 − (1 − π_i)^tokens] (uniform: E (1 − (1 − k/E)^tokens));
- under expert parallelism the experts are dealt to the ep ranks in order of popularity (rank r
  holds experts r, r + ep, r + 2 ep, …: the balanced static placement, no replicated experts), so
  rank 0 holds the hottest of each round. It receives the token share Σ_{i ∈ rank 0} π_i / k and reads
  its own distinct experts; every MoE layer waits for it, so it sets the step time.

All functions broadcast over configurations; the expert index is a trailing axis.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.traffic import expected_experts

REDISTRIBUTIONS = 8   # rounds of capping π at 1 and spreading the excess (converges in a few)


def inclusion_probabilities(num_experts, experts_per_token, skew):
    """π_i: the chance a token picks expert i (trailing axis, ranked by popularity; 0 beyond E)."""
    E, k, s = (np.asarray(v, dtype=float)[..., None] for v in (num_experts, experts_per_token, skew))
    rank = np.arange(1, int(np.max(num_experts)) + 1, dtype=float)
    present = rank <= E
    weight = np.where(present, rank ** -s, 0.0)
    # a dense model's row (E = 0) in a batch with MoE rows has no experts: all its π are 0, not 0/0
    pi = k * weight / np.maximum(weight.sum(axis=-1, keepdims=True), 1e-300)
    for _ in range(REDISTRIBUTIONS):
        capped = np.minimum(pi, 1.0)
        free = (capped < 1.0) & present
        excess = k - capped.sum(axis=-1, keepdims=True)
        share = np.where(free, capped, 0.0)
        pi = np.where(free, capped + excess * share / np.maximum(share.sum(axis=-1, keepdims=True), 1e-300), capped)
    return np.minimum(pi, 1.0)


def distinct_experts(num_experts, experts_per_token, tokens, skew):
    """Expected distinct experts one MoE layer reads for ``tokens`` tokens under Zipf skew ``skew``.

    Examples
    --------
    Uniform routing is the usual formula; skew concentrates the tokens on fewer experts:

    >>> round(float(distinct_experts(8, 2, 4, 0.0)), 2), round(float(distinct_experts(8, 2, 4, 1.5)), 2)
    (5.47, 3.89)
    """
    if not np.any(np.asarray(skew) > 0):   # uniform routing: the closed form, without an expert axis
        return expected_experts(num_experts, experts_per_token, tokens)
    pi = inclusion_probabilities(num_experts, experts_per_token, skew)
    return np.sum(1 - (1 - pi) ** np.asarray(tokens, dtype=float)[..., None], axis=-1)


def busiest_rank(num_experts, experts_per_token, tokens, skew, ep):
    """(token share, distinct experts) of the busiest of ``ep`` expert-parallel ranks.

    Examples
    --------
    Even routing over 4 ranks gives each a quarter of the tokens; skew loads rank 0:

    >>> round(float(busiest_rank(64, 8, 32, 0.0, 4)[0]), 3), round(float(busiest_rank(64, 8, 32, 1.0, 4)[0]), 3)
    (0.25, 0.299)
    """
    pi = inclusion_probabilities(num_experts, experts_per_token, skew)
    ep = np.asarray(ep, dtype=float)[..., None]
    on_first = (np.arange(pi.shape[-1]) % np.maximum(ep, 1)) == 0
    share = np.sum(np.where(on_first, pi, 0.0), axis=-1) / np.maximum(np.asarray(experts_per_token, dtype=float),
                                                                       1.0)
    touched = np.sum(np.where(on_first, 1 - (1 - pi) ** np.asarray(tokens, dtype=float)[..., None], 0.0), axis=-1)
    return share, touched
