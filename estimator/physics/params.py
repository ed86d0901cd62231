"""Parameter counts from shapes, split by where the weights live.

Counts are per model (plain Python ints); the timing code turns them into
columns of the sweep arrays. Conventions (docs/formulas.md §1):

- attention per layer: Q ``d·n_h·d_h``, K and V ``2·d·n_kv·d_h``, O ``n_h·d_h·d``;
  MLA replaces these with its low-rank projections (DeepSeek-V2 paper, §2.1);
- MLP per dense layer ``n_mat·d·d_ff`` with n_mat = 3 for gated MLPs;
- MoE layer: ``E·n_mat·d·d_e`` routed + ``E_sh·n_mat·d·d_sh`` shared + ``d·E`` router;
- the input embedding ``V·d`` is stored but only a row per token is read; the
  output head ``V·d`` is a separate matrix unless tied;
- RMSNorm/LayerNorm weights (``2·d`` per layer, ``d`` final) are counted;
  biases are not (under 0.1 % of any model here);
- Gated DeltaNet layers, lightning indexers, per-layer embeddings, AltUp and
  LAuReL add roles of their own (docs/formulas.md §15).
"""

from __future__ import annotations

from dataclasses import dataclass

from estimator.specs.model import ModelSpec, Shape


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by role. ``routed_expert_per_layer`` is one expert of one MoE layer."""

    embedding: int
    head: int
    attention: int            # all layers
    dense_mlp: int            # all dense-MLP layers
    shared_experts: int       # all MoE layers
    router: int               # all MoE layers
    routed_expert_one: int    # one expert in one layer
    num_moe_layers: int
    num_experts: int
    experts_per_token: int
    norms: int
    linear_attention: int = 0       # all Gated DeltaNet layers (docs/formulas.md §15.1)
    indexer: int = 0                # all lightning indexers (§15.2)
    per_layer_embedding: int = 0    # the per-layer-embedding table, held off the device (§15.3)
    ple_projections: int = 0        # per-layer-embedding projections and gates (§15.3)
    altup: int = 0                  # AltUp projections, routers and coefficients (§15.3)
    laurel: int = 0                 # LAuReL low-rank residual branches (§15.3)
    unused: int = 0                 # stored but never multiplied: K/V projections of KV-sharing layers (§15.3)

    @property
    def dense_linear(self) -> int:
        """Weights every token multiplies (stored ones it skips included): P_dense of docs/formulas.md §1."""
        return (self.attention + self.dense_mlp + self.shared_experts + self.router + self.linear_attention
                + self.indexer + self.ple_projections + self.altup + self.laurel)

    @property
    def routed_experts(self) -> int:
        return self.routed_expert_one * self.num_experts * self.num_moe_layers

    @property
    def total(self) -> int:
        """Every stored parameter: what memory must hold (all experts)."""
        return (self.embedding + self.head + self.dense_linear + self.routed_experts + self.norms
                + self.per_layer_embedding)

    def active_as_published(self, includes_embedding: bool = True) -> int:
        """Active parameters under the counting convention of a published figure."""
        return self.active if includes_embedding else self.active - self.embedding

    def total_as_published(self, includes_embeddings: bool = True) -> int:
        """Total parameters under a published convention: without the embedding tables, Gemma 3n's 'effective'."""
        return self.total if includes_embeddings else self.total - self.embedding - self.per_layer_embedding

    @property
    def active(self) -> int:
        """Parameters one token uses: embedding row table and head included, k routed experts."""
        routed_active = self.routed_expert_one * self.experts_per_token * self.num_moe_layers
        return self.total - self.routed_experts + routed_active


def attention_params_per_layer(s: Shape) -> int:
    """Q, K, V and O of one softmax-attention layer (MLA: its low-rank projections), with any output gate."""
    d, n_h = s.hidden_size, s.num_attention_heads
    if s.mla is None:
        gate = d * n_h * s.head_dim if s.attention_output_gate else 0
        return d * n_h * s.head_dim + 2 * d * s.num_kv_heads * s.head_dim + n_h * s.head_dim * d + gate
    m = s.mla
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = d * m.q_lora_rank + m.q_lora_rank * n_h * qk_head if m.q_lora_rank else d * n_h * qk_head
    kv_down = d * (m.kv_lora_rank + m.qk_rope_head_dim)             # W_DKV and W_KR
    kv_up = m.kv_lora_rank * n_h * (m.qk_nope_head_dim + m.v_head_dim)  # W_UK and W_UV
    out = n_h * m.v_head_dim * d
    return q + kv_down + kv_up + out


def linear_attention_params_per_layer(s: Shape) -> int:
    """One Gated DeltaNet layer (docs/formulas.md §15.1).

    Notes
    -----
    P_lin = d·(2·n_k·d_k + 2·n_v·d_v) (q, k, v, z) + d·2·n_v (b, a) + C·K (conv) + 2·n_v (A_log, dt_bias)
            + d_v (gated norm) + n_v·d_v·d (out),  C = 2·n_k·d_k + n_v·d_v
    """
    la, d = s.linear_attention, s.hidden_size
    if la is None:
        return 0
    key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
    return (d * (2 * key_dim + 2 * value_dim) + d * 2 * la.num_value_heads + la.conv_channels * la.conv_kernel_dim
            + 2 * la.num_value_heads + la.value_head_dim + value_dim * d)


def indexer_params_per_layer(s: Shape) -> int:
    """One lightning indexer (docs/formulas.md §15.2): wq_b from the query latent (or d), wk, k_norm, weights_proj."""
    sa, d = s.sparse_attention, s.hidden_size
    if sa is None:
        return 0
    q_in = s.mla.q_lora_rank if s.mla is not None and s.mla.q_lora_rank else d
    return q_in * sa.index_n_heads * sa.index_head_dim + d * sa.index_head_dim + 2 * sa.index_head_dim \
        + d * sa.index_n_heads


def _gemma3n_parts(s: Shape) -> dict[str, int]:
    """Per-layer embeddings, AltUp and LAuReL weights, and their norms (docs/formulas.md §15.3)."""
    d, L, ple, n = s.hidden_size, s.num_layers, s.per_layer_embeddings, s.altup_num_inputs
    d_ple = 0 if ple is None else ple.hidden_size_per_layer_input
    altup = 0 if n == 1 else 2 * (n - 1) * d * d + L * (d * n + n * n * n + n * n)
    return {
        "per_layer_embedding": 0 if ple is None else ple.vocab_size_per_layer_input * L * d_ple,
        "ple_projections": 0 if ple is None else d * L * d_ple + L * 2 * d * d_ple,
        "altup": altup,
        "laurel": L * 2 * d * s.laurel_rank,
        "norms": (0 if ple is None else L * d + d_ple) + (L * 2 * d if n > 1 else 0) + (L * d if s.laurel_rank else 0),
    }


def mlp_matrices(s: Shape) -> int:
    return 3 if s.mlp_gated else 2


def count_params(model: ModelSpec | Shape) -> ParamCounts:
    """Count parameters by role from the shapes.

    Examples
    --------
    How many parameters does Llama-2-7B have (published: 6.74 B)?

    >>> from estimator.specs.database import load_database
    >>> round(count_params(load_database().models.get("llama-2-7b")).total / 1e9, 2)
    6.74
    """
    s = model.shape if isinstance(model, ModelSpec) else model
    d, L, n_mat = s.hidden_size, s.num_layers, mlp_matrices(s)
    moe = s.moe
    num_moe_layers = 0 if moe is None else L - moe.num_dense_layers
    num_dense_layers = L - num_moe_layers
    lora_norms = 0 if s.mla is None else (s.mla.q_lora_rank or 0) + s.mla.kv_lora_rank
    extra = _gemma3n_parts(s)
    return ParamCounts(
        embedding=s.vocab_size * d,
        head=0 if s.tie_word_embeddings else s.vocab_size * d,
        attention=s.num_attention_layers * attention_params_per_layer(s),
        dense_mlp=num_dense_layers * n_mat * d * s.intermediate_size,
        shared_experts=0 if moe is None else num_moe_layers * moe.num_shared_experts * n_mat * d * moe.shared_width,
        router=0 if moe is None else num_moe_layers * d * moe.num_experts,
        routed_expert_one=0 if moe is None else n_mat * d * moe.expert_intermediate_size,
        num_moe_layers=num_moe_layers,
        num_experts=0 if moe is None else moe.num_experts,
        experts_per_token=0 if moe is None else moe.experts_per_token,
        norms=L * (2 * d + lora_norms) + d + extra["norms"],
        linear_attention=s.num_linear_layers * linear_attention_params_per_layer(s),
        indexer=s.num_attention_layers * indexer_params_per_layer(s),
        per_layer_embedding=extra["per_layer_embedding"],
        ple_projections=extra["ple_projections"],
        altup=extra["altup"],
        laurel=extra["laurel"],
        unused=s.num_kv_shared_layers * 2 * d * s.num_kv_heads * s.head_dim,
    )
