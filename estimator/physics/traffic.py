"""Bytes moved through main memory per phase, as a ledger of named terms.

Bytes are what kernels actually read or write (docs/formulas.md §1, §4, §5):

- weights are streamed once per forward pass; the input embedding is a row
  lookup (``tokens · d`` elements), not streamed; the output head is streamed
  even when tied to the embedding;
- an MoE layer streams only the experts the step's tokens route to: the
  expected number of distinct experts, under uniform independent routing, is
  ``E · (1 − (1 − k/E)^tokens)`` (BLIS roofline; an upper bound, since real
  routing is skewed);
- the KV cache is read for every attended token and written for each new one;
- with fused (FlashAttention-style) attention the score matrix never reaches
  memory; K/V are re-read once per query tile (Dao et al. 2022, Thm 2). Without
  it, the T×T scores are written and read twice per layer and head.

Activations are 16-bit. Ledgers are totals over the replica; each of its
devices moves an equal share (the caller divides), except that under tensor
parallelism KV heads replicate once tp exceeds the KV-head count and an MLA
latent is stored on every rank (docs/formulas.md §2), which ``kv_replication``
accounts for.
"""

from __future__ import annotations

import numpy as np

from estimator.physics.flops import prefill_pairs

ACTIVATION_BYTES = 2          # bf16/fp16 activations
LOGIT_BYTES = 4               # fp32 logits for sampling
FLASH_QUERY_TILE = 128        # rows per query tile, FlashAttention-2 forward for head_dim <= 128
UNFUSED_SCORE_PASSES = 4      # write QKᵀ, read it for softmax, write P, read P for P·V


def expected_experts(E, k, tokens):
    """Expected distinct experts per MoE layer hit by ``tokens`` tokens (uniform routing).

    Examples
    --------
    Mixtral (8 experts, top-2) at batch 4 touches about 5.5 experts per layer on average:

    >>> round(float(expected_experts(8, 2, 4)), 2)
    5.47
    """
    E, k, tokens = (np.asarray(a, dtype=float) for a in (E, k, tokens))
    safe_E = np.where(E > 0, E, 1.0)
    return np.where(E > 0, E * (1 - (1 - k / safe_E) ** tokens), 0.0)


def weight_bytes_streamed(m, f, tokens):
    """Weights read by one forward pass over ``tokens`` tokens (all sequences of the step)."""
    experts = expected_experts(m["experts"], m["experts_per_token"], tokens)
    routed = m["params_routed_one"] * m["moe_layers"] * experts
    head_bits = np.where(m["head_tied"] > 0, f["embedding_bits"], f["head_bits"])
    return (m["params_dense_linear"] * f["dense_bits"] + routed * f["expert_bits"] + m["params_head"] * head_bits) / 8 \
        + m["params_norms"] * ACTIVATION_BYTES


def weight_bytes_stored(m, f):
    """Every stored weight: all experts, embedding and (untied) head — what memory must hold."""
    routed = m["params_routed_one"] * m["moe_layers"] * m["experts"]
    head = np.where(m["head_tied"] > 0, 0.0, m["params_head"] * f["head_bits"])
    return (m["params_dense_linear"] * f["dense_bits"] + routed * f["expert_bits"] + head
            + m["params_embedding"] * f["embedding_bits"]) / 8 \
        + m["params_norms"] * ACTIVATION_BYTES


def kv_bytes_per_token_layer(m, kv_bits):
    """KV-cache bytes one token adds to one layer: 2·n_kv·d_h (MLA: d_c + d_r) elements."""
    return m["kv_elems_per_token_layer"] * kv_bits / 8


def kv_replication(m, tp):
    """Copies of the KV cache across N tensor-parallel ranks, relative to one copy.

    GQA: each rank holds max(1, n_kv/N) heads, so copies = N · max(1/N, 1/n_kv).
    MLA: the latent is replicated on every rank, so copies = N.
    """
    n = np.asarray(tp, dtype=float)
    gqa = n * np.maximum(1.0 / n, 1.0 / m["kv_heads"])
    return np.where(m["is_mla"] > 0, n, gqa)


def activation_bytes(m, f, tokens):
    """Matmul inputs/outputs, norms, embedding rows looked up, and the logits."""
    per_token = m["act_elems_per_token_layer"] * m["layers"] * ACTIVATION_BYTES
    embedding_rows = m["hidden"] * f["embedding_bits"] / 8
    return tokens * (per_token + embedding_rows)


def prefill_bytes(m, f, kv_bits, B, T, tp, fused_attention, cached=0):
    """Bytes moved to prefill B prompts of T tokens, the first ``cached`` already in the cache (replica totals)."""
    new = T - cached
    tokens = B * new
    kv_layer = kv_bytes_per_token_layer(m, kv_bits) * kv_replication(m, tp)
    pairs = prefill_pairs(m, T, cached)
    # fused: each query tile re-reads the K/V its rows attend to; unfused: K/V once plus the scores
    kv_rereads = np.maximum(pairs / FLASH_QUERY_TILE, m["layers"] * T)
    fused = B * kv_layer * kv_rereads
    unfused = B * (kv_layer * m["layers"] * T
                   + UNFUSED_SCORE_PASSES * ACTIVATION_BYTES * m["heads"] * m["layers"] * new * T)
    q_and_out = 2 * tokens * m["layers"] * m["q_elems_per_token_layer"] * ACTIVATION_BYTES
    return {
        "weights": weight_bytes_streamed(m, f, tokens),
        "kv_write": tokens * m["layers"] * kv_layer,
        "activations": activation_bytes(m, f, tokens) + B * m["vocab"] * LOGIT_BYTES,
        "attention": np.where(fused_attention, fused, unfused) + q_and_out,
    }


def decode_bytes(m, f, kv_bits, B, span_global, span_local, tp, fused_attention, q=1):
    """Bytes moved by one decode step of B sequences with ``q`` new tokens each (replica totals).

    Verifying q = γ + 1 drafted tokens reads the weights and each sequence's KV
    cache once, as a single decode step does; only the new tokens' KV writes,
    activations and scores grow with q (docs/formulas.md §10).
    """
    kv_layer = kv_bytes_per_token_layer(m, kv_bits) * kv_replication(m, tp)
    global_layers = m["layers"] - m["local_layers"]
    attended = global_layers * span_global + m["local_layers"] * span_local
    tokens = B * q
    scores = UNFUSED_SCORE_PASSES * ACTIVATION_BYTES * m["heads"] * attended * tokens
    q_and_out = 2 * tokens * m["layers"] * m["q_elems_per_token_layer"] * ACTIVATION_BYTES
    return {
        "weights": weight_bytes_streamed(m, f, tokens),
        "kv_read": B * kv_layer * attended,
        "kv_write": tokens * kv_layer * m["layers"],
        "activations": activation_bytes(m, f, tokens) + tokens * m["vocab"] * LOGIT_BYTES,
        "attention": np.where(fused_attention, 0.0, scores) + q_and_out,
    }


def kv_crossover_tokens(m, f, kv_bits, B, tp):
    """Context length at which a decode step reads as many KV-cache bytes as weight bytes.

    Solves B · kv_layer · (L_global · S + L_local · min(S, W)) = W_step for S. Past
    it, long contexts make decode KV-bound rather than weight-bound; a model whose
    layers are all sliding-window never gets there (inf).
    """
    per_token = B * kv_bytes_per_token_layer(m, kv_bits) * kv_replication(m, tp)
    weights = weight_bytes_streamed(m, f, B)
    global_layers = m["layers"] - m["local_layers"]
    within_window = weights / (per_token * m["layers"])
    beyond = (weights / per_token - m["local_layers"] * m["window"]) / np.where(global_layers > 0, global_layers, 1)
    crossover = np.where((m["window"] > 0) & (within_window > m["window"]), beyond, within_window)
    return np.where((m["window"] > 0) & (within_window > m["window"]) & (global_layers == 0), np.inf, crossover)
