"""FLOPs per phase, as a ledger of named terms (docs/formulas.md §4, §5).

Conventions: a multiply-add is 2 FLOPs (we count FLOPs, not MACs); a matmul
[M, K] × [K, N] costs 2·M·K·N. ``m`` is a dict of model columns
(:func:`estimator.evaluation.columns.model_columns`); every function broadcasts over the
batch ``B``, prompt ``T`` and context arguments.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.span import causal_pairs

# A Gated DeltaNet step per element of a head's d_k × d_v state: decay (1), kᵀS (2), the rank-1 delta
# update (2) and the read-out qᵀS (2) (docs/formulas.md §15.1).
STATE_FLOPS_PER_ELEMENT = 7


def matmul_params_per_token(m):
    """Weights one token multiplies through, excluding the output head.

    Dense linear layers plus k routed experts per MoE layer: the FLOPs do not
    depend on how many distinct experts a batch touches, only on k. Weights a
    layer stores but skips (the K/V projections of KV-sharing layers) do not count.
    """
    return (m["params_dense_linear"] - m["params_unused"]) \
        + m["params_routed_one"] * m["experts_per_token"] * m["moe_layers"]


def prefill_pairs(m, T, cached=0):
    """(query, key) pairs over all softmax-attention layers when tokens cached+1 .. T are prefilled.

    Global layers under sparse attention pair each query with at most its top-k keys (docs/formulas.md §15.2).
    """
    global_layers = m["attn_layers"] - m["local_layers"]
    return (global_layers * (causal_pairs(T, m["attn_topk"]) - causal_pairs(cached, m["attn_topk"]))
            + m["local_layers"] * (causal_pairs(T, m["window"]) - causal_pairs(cached, m["window"])))


def indexer_pairs(m, T, cached=0):
    """(query, key) pairs a lightning indexer scores in prefill: every cached key, in every layer.

    See docs/formulas.md §15.2.
    """
    return m["attn_layers"] * (causal_pairs(T, 0) - causal_pairs(cached, 0))


def indexer_flops(m, pairs):
    """Lightning-indexer FLOPs over ``pairs`` (query, key) pairs (docs/formulas.md §15.2).

    Notes
    -----
    F_idx = 2·n_i·(d_i + 1) per pair: n_i dot products of width d_i, then the ReLU scores weighted and summed.
    """
    return m["index_flops_per_pair_layer"] * pairs


def state_flops(m, tokens):
    """Gated DeltaNet state updates of ``tokens`` tokens over all linear layers (docs/formulas.md §15.1).

    Notes
    -----
    F_state = 7·n_v·d_k·d_v per token and linear layer, whatever the context (softmax attention: 4·n_h·d_h·S).
    """
    return m["state_flops_per_token"] * tokens


def prefill_flops(m, B, T, cached=0):
    """FLOPs to prefill B prompts of T tokens whose first ``cached`` tokens are already in the KV cache.

    Notes
    -----
    linear    = 2 · P_matmul · B · (T − c)
    attention = B · f_pair · Σ_layers [causal_pairs(T, W) − causal_pairs(c, W)], f_pair = 4·n_h·d_h
                (QKᵀ and AV; causal: T(T+1)/2 pairs, not T²; the new tokens attend to the cached
                ones too: servcalc's chunk formula T·c + T(T+1)/2, docs/formulas.md §5)
    head      = 2 · d · V · B — logits for the last position only

    Sparse attention caps each global layer's pairs at the top k, in the absorbed (decode) form once the
    prompt is longer than k, and adds the indexer's pairs; Gated DeltaNet layers add a constant state
    update per token instead of pairs (docs/formulas.md §15).
    """
    pairs = prefill_pairs(m, T, cached)
    per_pair = np.where((m["attn_topk"] > 0) & (T > m["attn_topk"]), m["attn_flops_decode_per_pair_layer"],
                        m["attn_flops_prefill_per_pair_layer"])
    return {
        "linear": 2.0 * matmul_params_per_token(m) * B * (T - cached),
        "attention": per_pair * pairs * B
        + indexer_flops(m, indexer_pairs(m, T, cached)) * B + state_flops(m, B * (T - cached)),
        "head": 2.0 * m["params_head"] * B,
    }


def decode_flops(m, B, span_global, span_local, span_topk=None, q=1):
    """FLOPs of one decode step: B sequences, ``q`` new tokens each (q = γ + 1 when verifying drafts).

    ``span_global``/``span_local`` are the tokens each new token attends to in a
    global / sliding-window layer; ``span_topk`` the mean of min(S, k_top) under sparse
    attention (None: no cap, ``span_global``).

    Notes
    -----
    linear    = 2 · P_matmul · B · q
    attention = B · q · [f_pair · (L_global · min(S, k_top) + L_local · min(S, W)) + F_idx · L_att · S + F_state]
    head      = 2 · d · V · B · q   (every verified position needs its logits)

    L_global counts softmax-attention layers only; F_idx and F_state are 0 without an indexer or
    linear-attention layers (docs/formulas.md §15).
    """
    span_top = span_global if span_topk is None else span_topk
    global_layers = m["attn_layers"] - m["local_layers"]
    attended = global_layers * span_top + m["local_layers"] * span_local
    return {
        "linear": 2.0 * matmul_params_per_token(m) * B * q,
        "attention": m["attn_flops_decode_per_pair_layer"] * attended * B * q
        + indexer_flops(m, m["attn_layers"] * span_global) * B * q + state_flops(m, B * q),
        "head": 2.0 * m["params_head"] * B * q,
    }


def total(ledger: dict) -> np.ndarray:
    """Sum of a ledger's terms."""
    return sum(ledger.values())
