"""Model specs: one YAML file per model in ``models_db/``, or a local ``config.json``.

Shapes use the names of Hugging Face ``config.json`` where one exists; the
mapping from each architecture's own key names is in :mod:`estimator.specs.config_json`.
Parameter counts are computed from the shapes (never typed in), and a test
checks them against the published counts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from estimator.errors import ConfigurationError
from estimator.specs.sourced import Frozen

# Bounds far beyond any published model, so that nonsense (a width of 10^30) fails on load rather than
# overflowing the arithmetic.
MAX_WIDTH = 2**20        # hidden, head, MLP and latent widths
MAX_LAYERS = 10_000
MAX_HEADS = 2**16        # attention heads, KV heads, experts
MAX_VOCAB = 2**24
MAX_TOKENS = 2**32       # context length, sliding window


# Mechanisms a model may need that Shape cannot describe, each explained in words for the refusal message.
# A spec that names one loads, lists, shows and has its parameters counted, but is not estimated: counting it
# as a plain transformer would be wrong (ModelSpec.require_modelled). Gated DeltaNet layers, DeepSeek Sparse
# Attention, per-layer embeddings and KV-cache sharing are described by Shape (docs/formulas.md §15).
Mechanism = Literal["linear_attention_state", "per_layer_ffn_widths"]
MECHANISMS: dict[str, str] = {
    "linear_attention_state": "state-space or recurrent layers other than Gated DeltaNet (such as Mamba, RWKV or "
                              "RG-LRU) that keep a fixed-size recurrent state per sequence instead of a KV cache",
    "per_layer_ffn_widths": "feed-forward widths that differ from layer to layer (such as a MatFormer mix-n-match "
                            "sub-model of Gemma 3n), where the shapes hold one intermediate_size",
}


def unmodelled_message(name: str, mechanisms: list[str]) -> str:
    """One line: ``name`` uses these mechanisms (in words), which the estimator does not model yet."""
    words = [MECHANISMS[m] for m in mechanisms]
    listed = words[0] if len(words) == 1 else "; ".join(words[:-1]) + "; and " + words[-1]
    return (f"{name} uses {listed}, which the estimator does not model yet; "
            f"estimating it as a plain transformer would be wrong")


class MoE(Frozen):
    """Mixture-of-experts feed-forward layers."""

    num_experts: int = Field(gt=1, le=MAX_HEADS, description="routed experts per MoE layer (E)")
    experts_per_token: int = Field(gt=0, le=MAX_HEADS, description="routed experts each token uses (k)")
    expert_intermediate_size: int = Field(gt=0, le=MAX_WIDTH, description="width of one routed expert's MLP (d_e)")
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_HEADS, description="always-active experts (E_sh)")
    shared_expert_intermediate_size: int | None = Field(
        default=None, gt=0, le=MAX_WIDTH,
        description="width of one shared expert; defaults to expert_intermediate_size")
    num_dense_layers: int = Field(default=0, ge=0, le=MAX_LAYERS, description="layers with a dense MLP instead of experts (DeepSeek first_k_dense_replace)")

    @model_validator(mode="after")
    def _k_le_e(self) -> MoE:
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        return self

    @property
    def shared_width(self) -> int:
        return self.shared_expert_intermediate_size or self.expert_intermediate_size


class MLA(Frozen):
    """Multi-head latent attention (DeepSeek-V2/V3): a compressed KV latent per token."""

    kv_lora_rank: int = Field(gt=0, le=MAX_WIDTH, description="latent width d_c")
    q_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH,
                                    description="query low-rank width; None = full-rank query")
    qk_rope_head_dim: int = Field(gt=0, le=MAX_WIDTH, description="decoupled RoPE key width d_r")
    qk_nope_head_dim: int = Field(gt=0, le=MAX_WIDTH)
    v_head_dim: int = Field(gt=0, le=MAX_WIDTH)


class LinearAttention(Frozen):
    """Gated DeltaNet linear-attention layers (Qwen3-Next): a fixed-size state per sequence instead of a KV cache.

    Layer i is full (softmax) attention when (i + 1) is a multiple of ``full_attention_interval``; the other
    layers are Gated DeltaNet (transformers ``Qwen3NextGatedDeltaNet``; docs/formulas.md §15.1).
    """

    full_attention_interval: int = Field(gt=0, le=MAX_LAYERS,
                                         description="every n-th layer is full attention, the others linear")
    num_key_heads: int = Field(gt=0, le=MAX_HEADS, description="query and key heads n_k (linear_num_key_heads)")
    key_head_dim: int = Field(gt=0, le=MAX_WIDTH, description="d_k (linear_key_head_dim)")
    num_value_heads: int = Field(gt=0, le=MAX_HEADS,
                                 description="value heads n_v, each with a d_k × d_v state (linear_num_value_heads)")
    value_head_dim: int = Field(gt=0, le=MAX_WIDTH, description="d_v (linear_value_head_dim)")
    conv_kernel_dim: int = Field(gt=0, le=1024, description="K, taps of the causal depthwise convolution over q, k "
                                                             "and v (linear_conv_kernel_dim)")

    @model_validator(mode="after")
    def _heads(self) -> LinearAttention:
        if self.num_value_heads % self.num_key_heads:
            raise ValueError(f"num_value_heads={self.num_value_heads} is not a multiple of "
                             f"num_key_heads={self.num_key_heads}")
        return self

    @property
    def conv_channels(self) -> int:
        """Channels the convolution runs over: q, k (n_k·d_k each) and v (n_v·d_v)."""
        return 2 * self.num_key_heads * self.key_head_dim + self.num_value_heads * self.value_head_dim


class SparseAttention(Frozen):
    """DeepSeek Sparse Attention: a lightning indexer scores every cached token, attention reads the top k.

    Per layer the indexer keeps one key per token (FP8 with a 32-bit scale per 128 values) shared by its
    heads (DeepSeek-V3.2-Exp ``inference/model.py``, class ``Indexer``; docs/formulas.md §15.2).
    """

    index_n_heads: int = Field(gt=0, le=MAX_HEADS, description="indexer heads n_i")
    index_head_dim: int = Field(gt=0, le=MAX_WIDTH, description="indexer query/key width d_i")
    index_topk: int = Field(gt=0, le=MAX_TOKENS, description="tokens each query attends to, k_top")


class PerLayerEmbeddings(Frozen):
    """Per-layer embeddings (Gemma 3n): a second table giving each token a vector for every layer.

    Only the rows of the current tokens are read, so the table can stay in host memory (docs/formulas.md
    §15.3): the estimate counts its parameters but keeps its bytes off the device.
    """

    hidden_size_per_layer_input: int = Field(gt=0, le=MAX_WIDTH, description="d_ple, width per layer")
    vocab_size_per_layer_input: int = Field(gt=0, le=MAX_VOCAB, description="V_ple, rows of the table")


class Shape(Frozen):
    """Architecture shapes, as in config.json."""

    hidden_size: int = Field(gt=0, le=MAX_WIDTH, description="d")
    num_layers: int = Field(gt=0, le=MAX_LAYERS, description="L (num_hidden_layers)")
    num_attention_heads: int = Field(gt=0, le=MAX_HEADS, description="n_h")
    num_kv_heads: int = Field(gt=0, le=MAX_HEADS, description="n_kv (num_key_value_heads)")
    head_dim: int = Field(gt=0, le=MAX_WIDTH, description="d_h, from config, never hidden/heads")
    intermediate_size: int = Field(gt=0, le=MAX_WIDTH, description="dense MLP width d_ff")
    vocab_size: int = Field(gt=0, le=MAX_VOCAB)
    tie_word_embeddings: bool
    max_context: int = Field(gt=0, le=MAX_TOKENS, description="max_position_embeddings")
    mlp_gated: bool = Field(default=True, description="SwiGLU/GeGLU: 3 matrices; plain MLP: 2")
    sliding_window: int | None = Field(default=None, gt=0, le=MAX_TOKENS,
                                       description="window of the local layers, tokens")
    num_local_layers: int = Field(default=0, ge=0, le=MAX_LAYERS, description="layers that attend within sliding_window (chunked attention counts too)")
    attention_logit_softcap: float | None = Field(
        default=None, gt=0, description="c of attn_logit_softcapping: attention scores pass through "
                                        "c·tanh(s/c) before the softmax (Gemma 2); None: no cap")
    moe: MoE | None = None
    mla: MLA | None = None
    attention_output_gate: bool = Field(
        default=False, description="the query projection also emits a sigmoid gate on the attention output "
                                   "(n_h·d_h more weights; Qwen3-Next gated attention)")
    linear_attention: LinearAttention | None = None
    sparse_attention: SparseAttention | None = None
    per_layer_embeddings: PerLayerEmbeddings | None = None
    num_kv_shared_layers: int = Field(
        default=0, ge=0, le=MAX_LAYERS,
        description="last layers that reuse the KV cache of an earlier layer instead of holding their own "
                    "(Gemma 3n num_kv_shared_layers)")
    num_kv_shared_local_layers: int = Field(
        default=0, ge=0, le=MAX_LAYERS, description="of those, sliding-window layers (from layer_types)")
    altup_num_inputs: int = Field(default=1, ge=1, le=64,
                                  description="AltUp copies of the hidden state (Gemma 3n: 4; 1 = no AltUp)")
    laurel_rank: int = Field(default=0, ge=0, le=MAX_WIDTH,
                             description="rank of the LAuReL low-rank residual branch per layer (0 = none)")

    @model_validator(mode="after")
    def _consistent(self) -> Shape:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
        if self.num_local_layers > self.num_layers:
            raise ValueError(f"num_local_layers={self.num_local_layers} exceeds num_layers={self.num_layers}")
        if self.num_local_layers and self.sliding_window is None:
            raise ValueError("num_local_layers is set but sliding_window is not")
        if self.moe is not None and self.moe.num_dense_layers > self.num_layers:
            raise ValueError("moe.num_dense_layers exceeds num_layers")
        attention = self.num_attention_layers
        if self.num_local_layers > attention:
            raise ValueError(f"num_local_layers={self.num_local_layers} exceeds the {attention} attention layers")
        if self.num_kv_shared_layers and self.num_kv_shared_layers >= attention:
            raise ValueError(f"num_kv_shared_layers={self.num_kv_shared_layers} leaves none of the {attention} "
                             "attention layers to hold a KV cache")
        local, shared_local = self.num_local_layers, self.num_kv_shared_local_layers
        if shared_local > min(self.num_kv_shared_layers, local) or \
                self.num_kv_shared_layers - shared_local > attention - local:
            raise ValueError(f"num_kv_shared_local_layers={shared_local} does not fit {self.num_kv_shared_layers} "
                             f"shared layers among {local} local and {attention - local} global layers")
        return self

    @property
    def num_linear_layers(self) -> int:
        """Layers with linear attention (a fixed-size state) instead of softmax attention."""
        la = self.linear_attention
        return 0 if la is None else self.num_layers - self.num_layers // la.full_attention_interval

    @property
    def num_attention_layers(self) -> int:
        """Layers with softmax attention: all of them, less the linear-attention layers."""
        return self.num_layers - self.num_linear_layers


class PublishedParams(Frozen):
    """Parameter counts as the model's authors publish them, in billions."""

    total_billion: float = Field(gt=0)
    active_billion: float | None = Field(default=None, gt=0, description="MoE only")
    active_includes_embedding: bool = Field(
        default=True, description="False where the authors' active count leaves out the input embedding table")
    total_includes_embeddings: bool = Field(
        default=True, description="False where the authors' total leaves out the embedding tables (the input "
                                  "embedding and any per-layer-embedding table), as Gemma 3n's 'effective' count")
    source: str = Field(min_length=8)
    note: str | None = None


class ModelSpec(Frozen):
    """A model: identity, shapes and where they come from."""

    name: str
    hf_id: str
    aliases: list[str] = Field(default_factory=list)
    family: str
    architecture: str | None = Field(
        default=None, description="the config.json's model_type (gemma2, llama ...): which implementation an engine "
                                  "runs, where engines differ by it; None where not recorded")
    config_source: str = Field(min_length=8, description="URL of the config.json the shapes are copied from")
    published_params: PublishedParams | None = None
    shape: Shape
    unmodelled_mechanisms: list[Mechanism] = Field(
        default_factory=list,
        description="mechanisms the model needs that the shapes cannot describe (see MECHANISMS); the entry loads, "
                    "is listed and shown, but estimating it is refused rather than treated as a plain transformer")
    notes: str | None = None

    @field_validator("unmodelled_mechanisms")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        repeated = sorted({m for m in value if value.count(m) > 1})
        if repeated:
            raise ValueError(f"lists {', '.join(repeated)} more than once")
        return value

    @property
    def published_params_checked(self) -> bool:
        """Whether computed counts must match the published ones (roofline check, tests/test_params.py).

        Not for a model with unmodelled mechanisms: its shapes leave out parameters (a state-space layer's
        projections, the other widths of a mix-n-match sub-model), so the two need not agree.
        """
        return not self.unmodelled_mechanisms

    def unmodelled_message(self) -> str | None:
        """The refusal, naming each missing mechanism in words; None for a model the estimator can describe."""
        return unmodelled_message(self.name, self.unmodelled_mechanisms) if self.unmodelled_mechanisms else None

    def require_modelled(self) -> ModelSpec:
        """This spec, or ConfigurationError when it needs a mechanism the estimator does not model.

        Called where a spec is resolved for an estimate (``estimator.evaluation.api``), so that ``estimate``,
        ``sweep`` and everything built on them refuse such a model with one line naming the mechanism.
        """
        message = self.unmodelled_message()
        if message is not None:
            raise ConfigurationError(message)
        return self
