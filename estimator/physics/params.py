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
  biases are not (under 0.1 % of any model here).
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

    @property
    def routed_experts(self) -> int:
        return self.routed_expert_one * self.num_experts * self.num_moe_layers

    @property
    def total(self) -> int:
        """Every stored parameter: what memory must hold (all experts)."""
        return (self.embedding + self.head + self.attention + self.dense_mlp
                + self.shared_experts + self.router + self.routed_experts + self.norms)

    def active_as_published(self, includes_embedding: bool = True) -> int:
        """Active parameters under the counting convention of a published figure."""
        return self.active if includes_embedding else self.active - self.embedding

    @property
    def active(self) -> int:
        """Parameters one token uses: embedding row table and head included, k routed experts."""
        routed_active = self.routed_expert_one * self.experts_per_token * self.num_moe_layers
        return self.total - self.routed_experts + routed_active


def attention_params_per_layer(s: Shape) -> int:
    d, n_h = s.hidden_size, s.num_attention_heads
    if s.mla is None:
        return d * n_h * s.head_dim + 2 * d * s.num_kv_heads * s.head_dim + n_h * s.head_dim * d
    m = s.mla
    qk_head = m.qk_nope_head_dim + m.qk_rope_head_dim
    q = d * m.q_lora_rank + m.q_lora_rank * n_h * qk_head if m.q_lora_rank else d * n_h * qk_head
    kv_down = d * (m.kv_lora_rank + m.qk_rope_head_dim)             # W_DKV and W_KR
    kv_up = m.kv_lora_rank * n_h * (m.qk_nope_head_dim + m.v_head_dim)  # W_UK and W_UV
    out = n_h * m.v_head_dim * d
    return q + kv_down + kv_up + out


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
    return ParamCounts(
        embedding=s.vocab_size * d,
        head=0 if s.tie_word_embeddings else s.vocab_size * d,
        attention=L * attention_params_per_layer(s),
        dense_mlp=num_dense_layers * n_mat * d * s.intermediate_size,
        shared_experts=0 if moe is None else num_moe_layers * moe.num_shared_experts * n_mat * d * moe.shared_width,
        router=0 if moe is None else num_moe_layers * d * moe.num_experts,
        routed_expert_one=0 if moe is None else n_mat * d * moe.expert_intermediate_size,
        num_moe_layers=num_moe_layers,
        num_experts=0 if moe is None else moe.num_experts,
        experts_per_token=0 if moe is None else moe.experts_per_token,
        norms=L * (2 * d + lora_norms) + d,
    )
