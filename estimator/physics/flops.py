"""FLOPs per phase, as a ledger of named terms (docs/formulas.md §4, §5).

Conventions: a multiply-add is 2 FLOPs (we count FLOPs, not MACs); a matmul
[M, K] × [K, N] costs 2·M·K·N. ``m`` is a dict of model columns
(:func:`estimator.evaluation.columns.model_columns`); every function broadcasts over the
batch ``B``, prompt ``T`` and context arguments.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.span import causal_pairs


def matmul_params_per_token(m):
    """Weights one token multiplies through, excluding the output head.

    Dense linear layers plus k routed experts per MoE layer: the FLOPs do not
    depend on how many distinct experts a batch touches, only on k.
    """
    return m["params_dense_linear"] + m["params_routed_one"] * m["experts_per_token"] * m["moe_layers"]


def prefill_pairs(m, T, cached=0):
    """(query, key) pairs over all layers when tokens cached+1 .. T are prefilled."""
    global_layers = m["layers"] - m["local_layers"]
    return (global_layers * (causal_pairs(T, 0) - causal_pairs(cached, 0))
            + m["local_layers"] * (causal_pairs(T, m["window"]) - causal_pairs(cached, m["window"])))


def prefill_flops(m, B, T, cached=0):
    """FLOPs to prefill B prompts of T tokens whose first ``cached`` tokens are already in the KV cache.

    Notes
    -----
    linear    = 2 · P_matmul · B · (T − c)
    attention = B · f_pair · Σ_layers [causal_pairs(T, W) − causal_pairs(c, W)], f_pair = 4·n_h·d_h
                (QKᵀ and AV; causal: T(T+1)/2 pairs, not T²; the new tokens attend to the cached
                ones too: servcalc's chunk formula T·c + T(T+1)/2, docs/formulas.md §5)
    head      = 2 · d · V · B — logits for the last position only
    """
    pairs = prefill_pairs(m, T, cached)
    return {
        "linear": 2.0 * matmul_params_per_token(m) * B * (T - cached),
        "attention": m["attn_flops_prefill_per_pair_layer"] * pairs * B,
        "head": 2.0 * m["params_head"] * B,
    }


def decode_flops(m, B, span_global, span_local, q=1):
    """FLOPs of one decode step: B sequences, ``q`` new tokens each (q = γ + 1 when verifying drafts).

    ``span_global``/``span_local`` are the tokens each new token attends to in a
    global / sliding-window layer.

    Notes
    -----
    linear    = 2 · P_matmul · B · q
    attention = B · q · f_pair · (L_global · S + L_local · min(S, W))
    head      = 2 · d · V · B · q   (every verified position needs its logits)
    """
    global_layers = m["layers"] - m["local_layers"]
    attended = global_layers * span_global + m["local_layers"] * span_local
    return {
        "linear": 2.0 * matmul_params_per_token(m) * B * q,
        "attention": m["attn_flops_decode_per_pair_layer"] * attended * B * q,
        "head": 2.0 * m["params_head"] * B * q,
    }


def total(ledger: dict) -> np.ndarray:
    """Sum of a ledger's terms."""
    return sum(ledger.values())
