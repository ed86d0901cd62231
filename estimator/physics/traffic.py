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
accounts for. Under attention data parallelism the tp ranks run attention on
their own sequences instead: each holds whole cache entries (no replication)
and reads the whole attention weights (docs/formulas.md §8).

Gated DeltaNet layers hold a fixed-size state per sequence instead of a cache,
read and rewritten every decode step; a sparse-attention indexer adds a key per
token that is read over the whole context while attention reads only the top k;
per-layer embeddings stay in host memory, a row per token (docs/formulas.md §15).

An eager engine moves more (docs/formulas.md §13): Hugging Face's attention copies grouped KV heads
out to one per query head before it attends (``kv_expand``), and each of its elementwise ops is a
pass of its own over its tensor (``elementwise``). An engine that widens a quantized cache to 16 bits
before attending (ExLlamaV2) copies it too, and attention reads the wide copy (``kv_expand``, §13).
"""

from __future__ import annotations

import numpy as np

from estimator.physics.flops import indexer_pairs, prefill_pairs

ACTIVATION_BYTES = 2          # bf16/fp16 activations
LOGIT_BYTES = 4               # fp32 logits for sampling
FLASH_QUERY_TILE = 128        # rows per query tile, FlashAttention-2 forward for head_dim <= 128
UNFUSED_SCORE_PASSES = 4      # write QKᵀ, read it for softmax, write P, read P for P·V
MATMUL_SCORE_PASSES = 2       # of those, the two the matmuls make (QKᵀ's write, P·V's read); the rest are kernels
#                               of their own that cannot overlap them (ledger term ``score_ops``)
SOFTCAP_SCORE_PASSES = 6      # an unfused soft-cap c·tanh(s/c): divide, tanh, multiply, each reads and writes
# Gated DeltaNet state in the model's 16-bit dtype (vLLM's mamba_ssm_cache_dtype "auto"); chunked prefill
# kernels (fla chunk_gated_delta_rule, llama.cpp qwen3next) store one state per 64-token chunk and read it
# back: docs/formulas.md §15.1.
STATE_BITS = 16
STATE_CHUNK_TOKENS = 64


# An engine that runs each elementwise op as its own kernel (eager PyTorch, Hugging Face's decoder layer) makes
# one pass over the op's tensor per op, 16-bit activations and the norm's statistics in fp32 (docs/formulas.md §13):
UNFUSED_NORM_RESIDUAL_BYTES = 48   # per element of d: two RMSNorms (to fp32 2+4, square 4+4, mean 4, scale 2+2)
#                                    and two residual adds (2+2+2), less the 8 the activation ledger counts
UNFUSED_HEADS_BYTES = 4            # per element of n_h·d_h: attention's output transposed back to rows (2+2)
UNFUSED_GATE_BYTES = 10            # per element of the gated FFN width: SiLU (2+2) and the gate product (4+2)


def unfused_elementwise_bytes_per_token(s, moe_layers: int) -> float:
    """Bytes one token's elementwise ops move over every layer when each runs as its own kernel, beyond the
    fused norms and residual adds the activation ledger counts (docs/formulas.md §13).

    Per layer: 48·d (two RMSNorms at 22 bytes per element of d, two residual adds at 6, less the 8 counted),
    4·n_h·d_h (attention's output transposed back to rows) and 10 per element of the gated FFN width a token
    runs (SiLU 2 + 2, the gate product 4 + 2): the op sequence of Hugging Face's eager decoder layer, which
    calibrate/decoder.py reproduces.
    """
    dense_layers = s.num_layers - moe_layers
    routed = 0 if s.moe is None else (s.moe.experts_per_token * s.moe.expert_intermediate_size
                                      + s.moe.num_shared_experts * s.moe.shared_width)
    per_layer = (UNFUSED_NORM_RESIDUAL_BYTES * s.hidden_size + UNFUSED_HEADS_BYTES * s.num_attention_heads * s.head_dim)
    return s.num_layers * per_layer + UNFUSED_GATE_BYTES * (dense_layers * s.intermediate_size + moe_layers * routed)


def unfused_elementwise_bytes(m, tokens, unfused_ops):
    """Bytes the unfused elementwise ops of a pass over ``tokens`` tokens move (nothing for a fused engine)."""
    return np.where(np.asarray(unfused_ops, dtype=bool), tokens * m["unfused_elementwise_bytes_per_token"], 0.0)


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
    return ((m["params_dense_linear"] - m["params_unused"]) * f["dense_bits"] + routed * f["expert_bits"]
            + m["params_head"] * head_bits) / 8 + m["params_norms"] * ACTIVATION_BYTES


def weight_bytes_stored(m, f):
    """Every stored weight: all experts, embedding and (untied) head — what the device must hold.

    A per-layer-embedding table is left out: it stays in host memory (:func:`host_embedding_bytes`).
    """
    routed = m["params_routed_one"] * m["moe_layers"] * m["experts"]
    head = np.where(m["head_tied"] > 0, 0.0, m["params_head"] * f["head_bits"])
    return (m["params_dense_linear"] * f["dense_bits"] + routed * f["expert_bits"] + head
            + m["params_embedding"] * f["embedding_bits"]) / 8 \
        + m["params_norms"] * ACTIVATION_BYTES


def input_embedding_bytes(m, f):
    """The input embedding table where it is not also the output head (untied): V·d at the embedding's bits.
    An engine that keeps its input layer in host memory (llama.cpp) holds these bytes off the device; a tied
    table is the head too, which the device holds."""
    return np.where(m["head_tied"] > 0, 0.0, m["params_embedding"] * f["embedding_bits"] / 8)


def host_embedding_bytes(m, f):
    """The per-layer-embedding table, kept in host memory: V_ple·L·d_ple at the embedding's bits.

    See docs/formulas.md §15.3.
    """
    return m["params_per_layer_embedding"] * f["embedding_bits"] / 8


def latent_bytes_per_token_layer(m, kv_bits):
    """The part of a token's cache entry attention reads: 2·n_kv·d_h (MLA: d_c + d_r) elements."""
    return m["kv_elems_per_token_layer"] * kv_bits / 8


def kv_bytes_per_token_layer(m, kv_bits):
    """KV-cache bytes one token adds to one layer: the attention entry plus any indexer key

    docs/formulas.md §2, §15.2).
    """
    return latent_bytes_per_token_layer(m, kv_bits) + m["index_key_bytes_per_token_layer"]


def kv_bytes_per_token(m, kv_bits):
    """Cache bytes one token adds over every layer that holds a cache (one copy, windows ignored)."""
    return kv_bytes_per_token_layer(m, kv_bits) * m["kv_layers"]


def state_replication(m, tp):
    """Copies of the Gated DeltaNet state across N tensor-parallel ranks: N · max(1/N, 1/n_k).

    See docs/formulas.md §15.1.
    """
    n = np.asarray(tp, dtype=float)
    return n * np.maximum(1.0 / n, 1.0 / m["state_heads"])


def state_bytes_per_sequence(m, tp):
    """Gated DeltaNet state of one sequence over all linear layers, TP copies included (docs/formulas.md §15.1).

    Notes
    -----
    state = L_lin · (n_v·d_k·d_v + C·(K − 1)) · β_state / 8, whatever the context.
    """
    return m["state_elems_per_sequence"] * STATE_BITS / 8 * state_replication(m, tp)


def kv_replication(m, tp):
    """Copies of the KV cache across N tensor-parallel ranks, relative to one copy.

    GQA: each rank holds max(1, n_kv/N) heads, so copies = N · max(1/N, 1/n_kv).
    MLA: the latent is replicated on every rank, so copies = N.
    """
    n = np.asarray(tp, dtype=float)
    gqa = n * np.maximum(1.0 / n, 1.0 / m["kv_heads"])
    return np.where(m["is_mla"] > 0, n, gqa)


def kv_split_ranks(tp, attention_dp):
    """Ranks a cache entry is split over by heads: tp, or 1 under attention data parallelism, where each rank
    keeps whole entries of its own sequences (docs/formulas.md §8)."""
    return np.where(np.asarray(attention_dp) > 0, 1.0, np.asarray(tp, dtype=float))


def replicated_attention_bytes(m, f, tp, attention_dp):
    """Token-mixer weights beyond one copy over the replica: under attention data parallelism each of the tp
    ranks holds and reads them whole, (tp − 1)·P_attn more (docs/formulas.md §8)."""
    extra = np.where(np.asarray(attention_dp) > 0, np.asarray(tp, dtype=float) - 1, 0.0)
    return extra * m["params_attention"] * f["dense_bits"] / 8


def activation_bytes(m, f, tokens):
    """Matmul inputs/outputs, norms, embedding rows looked up (per-layer-embedding rows too), and the logits."""
    per_token = m["act_elems_per_token_layer"] * m["layers"] * ACTIVATION_BYTES
    embedding_rows = m["hidden"] * f["embedding_bits"] / 8
    return tokens * (per_token + embedding_rows + m["ple_elems_per_token"] * f["embedding_bits"] / 8)


def kv_head_expansion(m, expands):
    """Heads attention reads per cached KV head: g = n_h / n_kv where the engine copies grouped heads out to
    one per query head before attending (Hugging Face's repeat_kv, ``expands``), else 1. An MLA latent is
    not a grouped head (docs/formulas.md §13)."""
    grouped = np.asarray(expands, dtype=bool) & (m["is_mla"] == 0)
    return np.where(grouped, m["query_heads_per_kv_head"], 1.0)


def score_passes(m):
    """Passes over the score matrix an unfused attention makes: the matmul's write, the softmax's read and write
    and the value matmul's read, plus the soft-cap's three elementwise ops where the model caps its scores
    (Gemma 2's attn_logit_softcapping; docs/formulas.md §13)."""
    return UNFUSED_SCORE_PASSES + SOFTCAP_SCORE_PASSES * m["softcapped_scores"]


def unfused_score_elements(new, cached, chunk_tokens):
    """Score elements per head and layer of an unfused prefill of ``new`` tokens past ``cached``, in chunks of
    ``chunk_tokens``: each chunk of c queries scores every key up to its end, masked ones too, so
    Σ c·(cached + k·c) = new·cached + new·(new + c)/2; one whole chunk (c = new) is the full new × T."""
    new = np.asarray(new, dtype=float)
    c = np.minimum(np.asarray(chunk_tokens, dtype=float), new)
    return new * cached + new * (new + c) / 2


def unfused_kv_reads(new, cached, chunk_tokens):
    """Cache tokens per layer an unfused prefill reads: every chunk of c queries reads the keys and values up to
    its end, so the reads are the score elements over c, (new/c)·cached + new·(new + c)/(2c); once, cached + new
    = T, for one whole chunk."""
    c = np.minimum(np.asarray(chunk_tokens, dtype=float), np.asarray(new, dtype=float))
    return unfused_score_elements(new, cached, chunk_tokens) / np.maximum(c, 1.0)


def _expansion_copy(cache_read, expansion):
    """Bytes of the copy that expands ``cache_read`` bytes of grouped heads g times: the compact read and the
    g-times write, (1 + g)·cache_read; nothing where g = 1 (docs/formulas.md §13)."""
    return np.where(expansion > 1, (1 + expansion) * cache_read, 0.0)


def _cache_copies(stored, attended, expansion):
    """Bytes of the copies a pass makes of its cache before attention reads it (docs/formulas.md §13): a
    quantized cache of ``stored`` bytes widened to ``attended`` bytes of 16-bit entries (read and write, where
    the two differ), then grouped heads expanded g times from the wide entries (:func:`_expansion_copy`)."""
    return np.where(attended != stored, stored + attended, 0.0) + _expansion_copy(attended, expansion)


def prefill_bytes(m, f, kv_bits, B, T, tp, fused_attention, cached=0, attention_dp=0, expansion=1.0,
                  unfused_ops=False, attended_bits=None, kv_reads=1.0, score_passes=UNFUSED_SCORE_PASSES,
                  score_bytes=ACTIVATION_BYTES, chunk_tokens=np.inf):
    """Bytes moved to prefill B prompts of T tokens, the first ``cached`` already in the cache (replica totals).

    Under sparse attention the latents are re-read per query tile over the capped pairs and the indexer
    keys over all pairs; Gated DeltaNet layers write their per-chunk states and the final one
    (docs/formulas.md §15). Without fused attention each chunk of ``chunk_tokens`` reads the cache up to its end
    and scores against it (:func:`unfused_kv_reads`, :func:`unfused_score_elements`), passing over the scores
    ``score_passes`` times at ``score_bytes`` an element. Where an engine expands grouped KV heads ``expansion``
    times (g, :func:`kv_head_expansion`), each layer copies the prompt's whole cache out and attention reads the
    copy; where its matmuls broadcast them (``kv_reads`` = g), attention reads the cache g times; where it widens
    a quantized cache to ``attended_bits`` (16) first, each layer copies the compact cache to wide entries that
    attention reads (:func:`_cache_copies`); where it runs its elementwise ops unfused (``unfused_ops``), each is
    a pass of its own (``elementwise``).
    """
    attended_bits = kv_bits if attended_bits is None else attended_bits
    new = T - cached
    tokens = B * new
    kv_tp = kv_split_ranks(tp, attention_dp)
    copies = kv_replication(m, kv_tp)
    kv_layer = kv_bytes_per_token_layer(m, kv_bits) * copies   # as stored; attention reads attended_bits
    latent_layer = latent_bytes_per_token_layer(m, attended_bits) * copies
    stored_layer = latent_bytes_per_token_layer(m, kv_bits) * copies
    pairs = prefill_pairs(m, T, cached)
    # fused: each query tile re-reads the K/V its rows attend to; unfused: K/V once plus the scores
    kv_rereads = np.maximum(pairs / FLASH_QUERY_TILE, m["attn_layers"] * T)
    fused = B * latent_layer * kv_rereads * expansion + B * _indexer_prefill_reads(m, T, cached) * copies
    score_pass = B * score_bytes * m["heads"] * m["attn_layers"] * unfused_score_elements(new, cached, chunk_tokens)
    unfused = B * (kv_bytes_per_token_layer(m, attended_bits) * copies * m["attn_layers"] * expansion * kv_reads
                   * unfused_kv_reads(new, cached, chunk_tokens)) + MATMUL_SCORE_PASSES * score_pass
    q_and_out = 2 * tokens * m["attn_layers"] * m["q_elems_per_token_layer"] * ACTIVATION_BYTES
    state = state_bytes_per_sequence(m, kv_tp)
    return {
        "weights": weight_bytes_streamed(m, f, tokens) + replicated_attention_bytes(m, f, tp, attention_dp),
        "kv_write": tokens * m["kv_layers"] * kv_layer + B * state,
        "activations": activation_bytes(m, f, tokens) + B * m["vocab"] * LOGIT_BYTES,
        "attention": np.where(fused_attention, fused, unfused) + q_and_out + B * _chunk_state_bytes(m, kv_tp, new),
        "score_ops": np.where(fused_attention, 0.0, (score_passes - MATMUL_SCORE_PASSES) * score_pass),
        "kv_expand": _cache_copies(B * stored_layer * m["attn_layers"] * T, B * latent_layer * m["attn_layers"] * T,
                                   expansion),
        "elementwise": unfused_elementwise_bytes(m, tokens, unfused_ops),
    }


def _indexer_prefill_reads(m, T, cached):
    """Indexer keys one prompt's prefill reads: once per query tile, at least once per token.

    See docs/formulas.md §15.2.
    """
    return m["index_key_bytes_per_token_layer"] * np.maximum(indexer_pairs(m, T, cached) / FLASH_QUERY_TILE,
                                                              m["attn_layers"] * T)


def _chunk_state_bytes(m, tp, new):
    """Per-chunk Gated DeltaNet states one sequence's prefill writes and reads back: 2·⌈n/64⌉·states.

    See docs/formulas.md §15.1.
    """
    chunks = np.ceil(np.asarray(new, dtype=float) / STATE_CHUNK_TOKENS)
    return 2 * chunks * m["recurrent_elems_per_sequence"] * STATE_BITS / 8 * state_replication(m, tp)


def decode_bytes(m, f, kv_bits, B, span_global, span_local, tp, fused_attention, q=1, span_topk=None,
                 attention_dp=0, expansion=1.0, unfused_ops=False, attended_bits=None, kv_reads=1.0,
                 score_passes=UNFUSED_SCORE_PASSES, score_bytes=ACTIVATION_BYTES):
    """Bytes moved by one decode step of B sequences with ``q`` new tokens each (replica totals).

    Verifying q = γ + 1 drafted tokens reads the weights and each sequence's KV
    cache once, as a single decode step does; only the new tokens' KV writes,
    activations and scores grow with q (docs/formulas.md §10). Sparse attention reads
    the latents of min(S, k_top) tokens (``span_topk``) and the indexer keys of all S;
    a Gated DeltaNet state is read once and written for every new token (docs/formulas.md §15). Where an
    engine expands grouped KV heads ``expansion`` times (g, :func:`kv_head_expansion`), the step copies the
    cache it attends to out g times and attention reads the copy: (1 + 2g) times the cache read in all; where its
    unfused matmuls broadcast them (``kv_reads`` = g), attention reads the cache g times. Unfused scores are
    passed over ``score_passes`` times at ``score_bytes`` an element.
    An engine that widens a quantized cache of C_q bytes to 16-bit entries of C_16 (``attended_bits``) first
    reads C_q and writes C_16, and attention (or the expansion) reads C_16 (:func:`_cache_copies`). An engine
    that runs its elementwise ops unfused (``unfused_ops``) makes a pass of its own for each (``elementwise``).
    """
    attended_bits = kv_bits if attended_bits is None else attended_bits
    kv_tp = kv_split_ranks(tp, attention_dp)
    copies = kv_replication(m, kv_tp)
    kv_layer = kv_bytes_per_token_layer(m, kv_bits) * copies
    latent_layer = latent_bytes_per_token_layer(m, attended_bits) * copies
    stored_layer = latent_bytes_per_token_layer(m, kv_bits) * copies
    span_top = span_global if span_topk is None else span_topk
    global_layers = m["attn_layers"] - m["local_layers"]
    attended = global_layers * span_top + m["local_layers"] * span_local
    tokens = B * q
    state = state_bytes_per_sequence(m, kv_tp)
    score_pass = score_bytes * m["heads"] * attended * tokens
    q_and_out = 2 * tokens * m["attn_layers"] * m["q_elems_per_token_layer"] * ACTIVATION_BYTES
    indexed = m["index_key_bytes_per_token_layer"] * copies * m["attn_layers"] * span_global
    return {
        "weights": weight_bytes_streamed(m, f, tokens) + replicated_attention_bytes(m, f, tp, attention_dp),
        "kv_read": B * latent_layer * attended * expansion * kv_reads + B * indexed + B * state,
        "kv_write": tokens * kv_layer * m["kv_layers"] + tokens * state,
        "activations": activation_bytes(m, f, tokens) + tokens * m["vocab"] * LOGIT_BYTES,
        "attention": np.where(fused_attention, 0.0, MATMUL_SCORE_PASSES * score_pass) + q_and_out,
        "score_ops": np.where(fused_attention, 0.0, (score_passes - MATMUL_SCORE_PASSES) * score_pass),
        "kv_expand": _cache_copies(B * stored_layer * attended, B * latent_layer * attended, expansion),
        "elementwise": unfused_elementwise_bytes(m, tokens, unfused_ops),
    }


def kv_crossover_tokens(m, f, kv_bits, B, tp):
    """Context length at which a decode step reads as many KV-cache bytes as weight bytes.

    Solves B · kv_layer · (L_global · S + L_local · min(S, W)) = W_step for S. Past
    it, long contexts make decode KV-bound rather than weight-bound; a model whose
    layers are all sliding-window (or linear-attention) never gets there (inf). Under
    sparse attention the latent reads stop at k_top and only the indexer keys grow
    (docs/formulas.md §15.2).
    """
    per_token = B * kv_bytes_per_token_layer(m, kv_bits) * kv_replication(m, tp)
    weights = weight_bytes_streamed(m, f, B)
    global_layers = m["attn_layers"] - m["local_layers"]
    within_window = weights / (per_token * np.maximum(m["attn_layers"], 1))
    beyond = (weights / per_token - m["local_layers"] * m["window"]) / np.where(global_layers > 0, global_layers, 1)
    crossover = np.where((m["window"] > 0) & (within_window > m["window"]), beyond, within_window)
    crossover = np.where((m["attn_topk"] > 0) & (crossover > m["attn_topk"]), _sparse_crossover(m, kv_bits, B, tp,
                                                                                               weights), crossover)
    return np.where(((m["window"] > 0) & (within_window > m["window"]) & (global_layers == 0))
                    | (m["attn_layers"] == 0), np.inf, crossover)


def _sparse_crossover(m, kv_bits, B, tp, weights):
    """S beyond k_top where B·(latent·L_att·k_top + index_key·L_att·S) = W_step (global layers only)."""
    copies = B * kv_replication(m, tp) * m["attn_layers"]
    index = m["index_key_bytes_per_token_layer"] * copies
    rest = weights - latent_bytes_per_token_layer(m, kv_bits) * copies * m["attn_topk"]
    return np.where(index > 0, rest / np.where(index > 0, index, 1.0), np.inf)
