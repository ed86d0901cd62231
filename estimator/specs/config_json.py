"""Read a Hugging Face ``config.json`` into a :class:`~estimator.specs.model.ModelSpec`.

Architectures name the same shapes differently (``num_local_experts`` in
Mixtral, ``num_experts`` in Qwen-MoE, ``n_routed_experts`` in DeepSeek); this
module maps them onto :class:`~estimator.specs.model.Shape`. Multimodal configs keep
the language model under ``text_config``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from estimator.errors import ConfigurationError, DatabaseError, describe_validation_error, read_text
from estimator.specs.model import (
    MECHANISMS,
    MLA,
    LinearAttention,
    ModelSpec,
    MoE,
    PerLayerEmbeddings,
    Shape,
    SparseAttention,
    unmodelled_message,
)

PLAIN_MLP_TYPES = {"gptj", "gpt_neox", "falcon", "gpt2", "phi", "opt", "bloom", "starcoder2"}
# transformers' PretrainedConfig ties embeddings by default; these architectures' configs default to untied.
UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
                     "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "llama4_text", "glm4_moe_lite", "gptj"}
# Gemma2Config caps attention logits at 50 unless the config says otherwise (transformers' configuration_gemma2.py:
# attn_logit_softcapping=50.0); a null there means no cap, as Gemma 3's configs write it.
SOFTCAPPED_BY_DEFAULT = {"gemma2": 50.0}
# Llama 4 MoE layers always add one shared expert as wide as a routed one (no config key says so).
ALWAYS_ONE_SHARED_EXPERT = {"llama4", "llama4_text"}

# Mechanisms the shapes cannot describe (estimator.specs.model.MECHANISMS): a config that shows one gets a spec
# that loads but refuses to be estimated. Architectures with state-space or recurrent layers:
RECURRENT_STATE_TYPES = {"mamba", "mamba2", "falcon_mamba", "jamba", "rwkv", "rwkv5", "rwkv6", "rwkv7",
                         "recurrent_gemma", "zamba", "zamba2", "bamba", "falcon_h1", "nemotron_h", "lfm2",
                         "granitemoehybrid"}
RECURRENT_STATE_KEYS = ("ssm_state_size", "mamba_d_state", "mamba_expand", "attn_layer_period")
RECURRENT_LAYER_WORDS = ("linear", "mamba", "recurrent", "ssm", "rwkv", "deltanet")
# Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5), which Shape.linear_attention describes:
GATED_DELTANET_KEYS = ("linear_num_key_heads", "linear_key_head_dim", "linear_num_value_heads",
                       "linear_value_head_dim", "linear_conv_kernel_dim")
GATED_DELTANET_LAYERS = {"linear_attention", "full_attention"}
# Qwen3-Next's gated attention has no config key for its output gate; Qwen3.5 writes attn_output_gate.
ALWAYS_OUTPUT_GATE = {"qwen3_next"}
SPARSE_ATTENTION_KEYS = ("index_topk", "index_n_heads", "index_head_dim")   # DeepSeek-V3.2's lightning indexer
DEEPSEEK_V32_INDEXER = {"index_n_heads": 64, "index_head_dim": 128, "index_topk": 2048}   # DeepseekV32Config defaults


def _first(cfg: dict, *keys, default=None):
    for key in keys:
        if cfg.get(key) is not None:
            return cfg[key]
    return default


def _moe(cfg: dict, layers: int) -> MoE | None:
    experts = _first(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    if not experts or experts <= 1:
        return None
    per_token = _first(cfg, "num_experts_per_tok", "experts_per_token", "moe_topk")
    width = _first(cfg, "moe_intermediate_size", default=cfg.get("intermediate_size"))
    shared = _first(cfg, "n_shared_experts", "num_shared_experts", default=0)
    shared_width = cfg.get("shared_expert_intermediate_size") or None   # Qwen3-MoE writes 0 for "none"
    if shared_width and not shared:
        shared = 1
    if cfg.get("model_type") in ALWAYS_ONE_SHARED_EXPERT:
        shared = 1
    dense = _first(cfg, "first_k_dense_replace", default=0)
    step = cfg.get("interleave_moe_layer_step") or cfg.get("decoder_sparse_step") or 1
    dense += (layers - dense) - (layers - dense) // step
    return MoE(num_experts=experts, experts_per_token=per_token, expert_intermediate_size=width,
               num_shared_experts=shared, shared_expert_intermediate_size=shared_width, num_dense_layers=dense)


def _mla(cfg: dict) -> MLA | None:
    if not cfg.get("kv_lora_rank"):
        return None
    return MLA(kv_lora_rank=cfg["kv_lora_rank"], q_lora_rank=cfg.get("q_lora_rank"),
               qk_rope_head_dim=cfg["qk_rope_head_dim"], qk_nope_head_dim=cfg["qk_nope_head_dim"],
               v_head_dim=cfg["v_head_dim"])


def _local_layers(cfg: dict, layers: int) -> tuple[int | None, int]:
    """Sliding-window (or chunked) layers and their window."""
    if cfg.get("layer_types"):
        local = sum(t in ("sliding_attention", "chunked_attention") for t in cfg["layer_types"])
        window = _first(cfg, "sliding_window", "attention_chunk_size")
        return (window, local) if local else (None, 0)
    if cfg.get("attention_chunk_size"):  # Llama 4: NoPE global attention every 4th layer
        period = cfg.get("no_rope_layer_interval", 4)
        return cfg["attention_chunk_size"], layers - layers // period
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:
        return None, 0
    pattern = cfg.get("sliding_window_pattern")
    if pattern:  # Gemma 3: every pattern-th layer is global
        return window, layers - layers // pattern
    if cfg.get("model_type") == "gemma2":  # alternating local/global, no key says so
        return window, layers // 2
    return window, layers


def _gated_deltanet(text: dict) -> bool:
    """Whether the config's recurrent layers are all Gated DeltaNet, which the shapes describe."""
    layer_types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else []
    return all(text.get(k) for k in GATED_DELTANET_KEYS) and set(map(str, layer_types)) <= GATED_DELTANET_LAYERS \
        and str(text.get("model_type")) not in RECURRENT_STATE_TYPES


def _linear_attention(text: dict, layers: int, source: str) -> LinearAttention:
    """Gated DeltaNet shapes; the interval from full_attention_interval, else from a periodic layer_types."""
    interval = text.get("full_attention_interval")
    kinds = text.get("layer_types")
    if isinstance(kinds, list) and kinds:
        full = [i for i, k in enumerate(kinds) if k == "full_attention"]
        period = interval or (full[0] + 1 if full else layers + 1)
        if len(kinds) != layers or full != [i for i in range(layers) if (i + 1) % period == 0]:
            raise DatabaseError(f"{source}: layer_types puts full attention at layers {_shown_list(full)}, not every "
                                f"{period}-th layer; the shapes hold a full_attention_interval only")
        interval = period
    return LinearAttention(full_attention_interval=interval or 4, num_key_heads=text["linear_num_key_heads"],
                           key_head_dim=text["linear_key_head_dim"], num_value_heads=text["linear_num_value_heads"],
                           value_head_dim=text["linear_value_head_dim"],
                           conv_kernel_dim=text["linear_conv_kernel_dim"])


def _sparse_attention(cfg: dict, text: dict) -> SparseAttention | None:
    """DeepSeek Sparse Attention; a deepseek_v32 config without the keys takes DeepseekV32Config's defaults."""
    if not any(text.get(k) for k in SPARSE_ATTENTION_KEYS) and "deepseek_v32" not in {
            cfg.get("model_type"), text.get("model_type")}:
        return None
    return SparseAttention(**{k: text.get(k) or default for k, default in DEEPSEEK_V32_INDEXER.items()})


def _per_layer_embeddings(text: dict) -> PerLayerEmbeddings | None:
    if not text.get("hidden_size_per_layer_input"):
        return None
    return PerLayerEmbeddings(hidden_size_per_layer_input=text["hidden_size_per_layer_input"],
                              vocab_size_per_layer_input=text.get("vocab_size_per_layer_input") or text["vocab_size"])


def _kv_shared(text: dict, layers: int, source: str) -> tuple[int, int]:
    """Layers that reuse an earlier layer's KV cache (the last num_kv_shared_layers), and how many are local."""
    shared = text.get("num_kv_shared_layers") or 0
    kinds = text.get("layer_types") if isinstance(text.get("layer_types"), list) else []
    local = sum(k in ("sliding_attention", "chunked_attention") for k in kinds[layers - shared:]) if shared else 0
    if shared and not kinds and text.get("sliding_window"):
        raise DatabaseError(f"{source}: num_kv_shared_layers is set without layer_types, so which of the shared "
                            "layers are sliding-window ones is not known")
    return shared, local


def unmodelled_mechanisms(cfg: dict) -> list[str]:
    """Mechanisms a config.json shows that the shapes cannot describe, in MECHANISMS order."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    types = {str(c.get("model_type")) for c in (cfg, text)}

    def has(keys) -> bool:
        return any(c.get(k) not in (None, 0, False, [], "") for c in (cfg, text) for k in keys)

    layer_types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else []
    recurrent_layer = any(word in str(t).lower() for t in layer_types for word in RECURRENT_LAYER_WORDS)
    pattern = str(_first(text, "hybrid_override_pattern", default=""))   # Nemotron-H: M = Mamba layer
    recurrent = bool(types & RECURRENT_STATE_TYPES) or has(RECURRENT_STATE_KEYS) or recurrent_layer or "M" in pattern \
        or has(GATED_DELTANET_KEYS)
    widths = text.get("intermediate_size")
    found = {
        "linear_attention_state": recurrent and not _gated_deltanet(text),
        "per_layer_ffn_widths": isinstance(widths, list) and len(set(map(repr, widths))) > 1,
    }
    return [m for m in MECHANISMS if found[m]]


def _mlp_width(source: str, value):
    """One dense MLP width; a per-layer list (Gemma 3n) is accepted when every layer has the same width."""
    if isinstance(value, list):
        if not value or len(set(map(repr, value))) > 1:
            raise DatabaseError(f"{source}: intermediate_size differs between layers ({_shown_list(value)}), "
                                f"which the shapes cannot describe; {NO_SHAPES}")
        return value[0]
    return value


def _shown_list(value: list) -> str:
    return ", ".join(map(str, value[:6])) + (", ..." if len(value) > 6 else "")


NO_SHAPES = "write a models_db YAML entry instead (see `roofline show model llama-2-7b`)"


def _whole(source: str, key: str, value) -> int:
    """A count the shapes are derived from (a divisor, a range): a whole number >= 1."""
    if value is None:
        raise DatabaseError(f"{source}: cannot read model shapes from this config.json (no {key}); {NO_SHAPES}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer() or value < 1:
        raise DatabaseError(f"{source}: {key} must be a whole number >= 1, got {value!r}")
    return int(value)


def spec_from_config(cfg: dict, name: str, source: str) -> ModelSpec:
    """Build a spec from a config.json mapping.

    A config showing a mechanism the shapes cannot describe gives a spec that names it in
    ``unmodelled_mechanisms`` (estimates refuse it); where its shapes cannot be read at all (a pure
    Mamba or RWKV config has no attention heads), the error names the mechanism instead of the missing key.
    """
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise DatabaseError(f"{source}: text_config must be a JSON object, got {type(text).__name__}")
    mechanisms = unmodelled_mechanisms(cfg)
    try:
        shape = _shape(cfg, text, source)
    except DatabaseError:
        if not mechanisms:
            raise
        raise ConfigurationError(f"{source}: {unmodelled_message(name, mechanisms)}") from None
    return ModelSpec(name=name, hf_id=name, family=str(text.get("model_type", "unknown")),
                     architecture=str(cfg["model_type"]) if cfg.get("model_type") else None,
                     config_source=source, shape=shape, unmodelled_mechanisms=mechanisms)


def _shape(cfg: dict, text: dict, source: str) -> Shape:
    """The shapes of a config.json (``text`` is its language model's part), or DatabaseError naming the fault."""
    try:
        hidden = _whole(source, "hidden_size", _first(text, "hidden_size", "n_embd", "d_model"))
        layers = _whole(source, "num_hidden_layers", _first(text, "num_hidden_layers", "n_layer", "num_layers"))
        heads = _whole(source, "num_attention_heads", _first(text, "num_attention_heads", "n_head"))
        mla = _mla(text)
        kv_heads = heads if mla else _first(
            text, "num_key_value_heads", "num_kv_heads", default=1 if text.get("multi_query") else heads)
        head_dim = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) if mla else _first(
            text, "head_dim", default=hidden // heads)
        window, local = _local_layers(text, layers)
        shared, shared_local = _kv_shared(text, layers, source)
        return Shape(
            hidden_size=hidden, num_layers=layers, num_attention_heads=heads, num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=_mlp_width(source, _first(
                text, "intermediate_size_mlp", "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)),
            vocab_size=text["vocab_size"],
            tie_word_embeddings=bool(_first(
                text, "tie_word_embeddings",
                default=cfg.get("tie_word_embeddings", text.get("model_type") not in UNTIED_BY_DEFAULT))),
            max_context=_first(text, "max_position_embeddings", "n_positions", "seq_length", default=2048),
            mlp_gated=text.get("model_type") not in PLAIN_MLP_TYPES,
            sliding_window=window, num_local_layers=local, moe=_moe(text, layers), mla=mla,
            attention_logit_softcap=text.get("attn_logit_softcapping",
                                             SOFTCAPPED_BY_DEFAULT.get(text.get("model_type"))) or None,
            attention_output_gate=bool(text.get("attn_output_gate") or text.get("model_type") in ALWAYS_OUTPUT_GATE),
            linear_attention=_linear_attention(text, layers, source) if _gated_deltanet(text) else None,
            sparse_attention=_sparse_attention(cfg, text),
            per_layer_embeddings=_per_layer_embeddings(text),
            num_kv_shared_layers=shared, num_kv_shared_local_layers=shared_local,
            altup_num_inputs=text.get("altup_num_inputs") or 1, laurel_rank=text.get("laurel_rank") or 0)
    except ValidationError as exc:
        raise DatabaseError(f"{source}: not valid model shapes: {describe_validation_error(exc)}") from None
    except KeyError as exc:
        raise DatabaseError(f"{source}: cannot read model shapes from this config.json (no {exc}); {NO_SHAPES}") \
            from None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        raise DatabaseError(f"{source}: cannot read model shapes from this config.json ({exc}); {NO_SHAPES}") \
            from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def load_config_json(path: str | Path) -> ModelSpec:
    """Read a local config.json (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    try:
        cfg = json.loads(read_text(path, "config.json"), parse_constant=_no_constant)
    except ValueError as exc:
        raise DatabaseError(f"{path}: not valid JSON: {exc}") from None
    except RecursionError:
        raise DatabaseError(f"{path}: not valid JSON: nested too deeply") from None
    if not isinstance(cfg, dict):
        raise DatabaseError(f"{path}: a config.json holds a JSON object, got {type(cfg).__name__}")
    name = cfg.get("_name_or_path") or path.parent.name or path.stem
    return spec_from_config(cfg, str(name), f"file://{path.resolve()}")
