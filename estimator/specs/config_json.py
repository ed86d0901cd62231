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
from estimator.specs.model import MECHANISMS, MLA, ModelSpec, MoE, Shape, unmodelled_message

PLAIN_MLP_TYPES = {"gptj", "gpt_neox", "falcon", "gpt2", "phi", "opt", "bloom", "starcoder2"}
# transformers' PretrainedConfig ties embeddings by default; these architectures' configs default to untied.
UNTIED_BY_DEFAULT = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "phi3",
                     "deepseek_v2", "deepseek_v3", "gpt_oss", "llama4", "llama4_text", "glm4_moe_lite", "gptj"}
# Llama 4 MoE layers always add one shared expert as wide as a routed one (no config key says so).
ALWAYS_ONE_SHARED_EXPERT = {"llama4", "llama4_text"}

# Mechanisms the shapes cannot describe (estimator.specs.model.MECHANISMS): a config that shows one gets a spec
# that loads but refuses to be estimated. Architectures with linear-attention or state-space layers:
RECURRENT_STATE_TYPES = {"qwen3_next", "mamba", "mamba2", "falcon_mamba", "jamba", "rwkv", "rwkv5", "rwkv6", "rwkv7",
                         "recurrent_gemma", "zamba", "zamba2", "bamba", "falcon_h1", "nemotron_h", "lfm2",
                         "granitemoehybrid"}
RECURRENT_STATE_KEYS = ("full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
                        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim",
                        "ssm_state_size", "mamba_d_state")
RECURRENT_LAYER_WORDS = ("linear", "mamba", "recurrent", "ssm", "rwkv", "deltanet")
SPARSE_ATTENTION_TYPES = {"deepseek_v32"}
SPARSE_ATTENTION_KEYS = ("index_topk", "index_n_heads", "index_head_dim")   # DeepSeek-V3.2's lightning indexer
PER_LAYER_EMBEDDING_TYPES = {"gemma3n", "gemma3n_text"}
PER_LAYER_EMBEDDING_KEYS = ("hidden_size_per_layer_input", "vocab_size_per_layer_input")


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


def unmodelled_mechanisms(cfg: dict) -> list[str]:
    """Mechanisms a config.json shows that the shapes cannot describe, in MECHANISMS order."""
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    types = {str(c.get("model_type")) for c in (cfg, text)}

    def has(keys) -> bool:
        return any(c.get(k) not in (None, 0, False, [], "") for c in (cfg, text) for k in keys)

    layer_types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else []
    recurrent_layer = any(word in str(t).lower() for t in layer_types for word in RECURRENT_LAYER_WORDS)
    pattern = str(_first(text, "hybrid_override_pattern", default=""))   # Nemotron-H: M = Mamba layer
    found = {
        "linear_attention_state": bool(types & RECURRENT_STATE_TYPES) or has(RECURRENT_STATE_KEYS)
        or recurrent_layer or "M" in pattern,
        "sparse_attention": bool(types & SPARSE_ATTENTION_TYPES) or has(SPARSE_ATTENTION_KEYS),
        "per_layer_embeddings": bool(types & PER_LAYER_EMBEDDING_TYPES) or has(PER_LAYER_EMBEDDING_KEYS),
        "kv_cache_sharing": has(("num_kv_shared_layers",)),
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
            sliding_window=window, num_local_layers=local, moe=_moe(text, layers), mla=mla)
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
