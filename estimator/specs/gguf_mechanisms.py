"""GGUF metadata of the mechanisms beyond a plain transformer (docs/formulas.md §15), as Shape fields.

llama.cpp names (``convert_hf_to_gguf.py``, ``gguf-py/gguf/constants.py``):

- ``qwen3next`` (Qwen3-Next, Gated DeltaNet): ``ssm.conv_kernel`` = linear_conv_kernel_dim,
  ``ssm.state_size`` = linear_key_head_dim, ``ssm.group_count`` = linear_num_key_heads,
  ``ssm.time_step_rank`` = linear_num_value_heads, ``ssm.inner_size`` = value heads × value head dim,
  ``full_attention_interval``; its ``attn_q`` tensor also emits the output gate;
- ``deepseek32`` (DeepSeek-V3.2, sparse attention, llama.cpp PR #23346): ``attention.indexer.head_count``,
  ``attention.indexer.key_length``, ``attention.indexer.top_k``;
- ``gemma3n``: ``embedding_length_per_layer_input``, the ``per_layer_token_embd`` table,
  ``attention.shared_kv_layers``, ``altup.num_inputs``, the ``laurel_l`` tensor's width (rank), and
  ``attention.sliding_window_pattern`` as per-layer flags.

Architectures with state-space or other recurrent layers are refused by name (``RECURRENT_ARCHITECTURES``).
"""

from __future__ import annotations

from estimator.errors import ConfigurationError
from estimator.specs.model import MECHANISMS, LinearAttention, PerLayerEmbeddings, SparseAttention

# llama.cpp architectures whose recurrent layers the shapes do not describe (Mamba, RWKV, hybrids of them).
RECURRENT_ARCHITECTURES = {"mamba", "mamba2", "jamba", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "falcon-h1",
                           "granitehybrid", "nemotron_h", "nemotron_h_moe", "lfm2", "lfm2moe", "plamo2",
                           "kimi-linear"}
PER_LAYER_EMBEDDING_TENSOR = "per_layer_token_embd.weight"


def refuse_recurrent(arch: str, source: str) -> None:
    """ConfigurationError naming the missing mechanism, for an architecture with recurrent layers."""
    if arch in RECURRENT_ARCHITECTURES:
        raise ConfigurationError(f"{source}: GGUF architecture {arch!r} uses {MECHANISMS['linear_attention_state']}, "
                                 "which the estimator does not model yet")


def mechanism_fields(meta: dict, tensors: dict, arch: str, layers: int, d: int, read_int, source: str) -> dict:
    """Shape fields of ``arch``'s mechanisms (empty for a plain transformer).

    ``tensors`` maps names to TensorInfo; ``read_int(key, default)`` reads one whole-number metadata value.
    """
    fields: dict = {}
    if arch == "qwen3next":
        fields["attention_output_gate"] = True
        fields["linear_attention"] = _linear_attention(arch, read_int, source)
    if read_int(f"{arch}.attention.indexer.top_k", None):
        fields["sparse_attention"] = SparseAttention(
            index_n_heads=read_int(f"{arch}.attention.indexer.head_count", None),
            index_head_dim=read_int(f"{arch}.attention.indexer.key_length", None),
            index_topk=read_int(f"{arch}.attention.indexer.top_k", None))
    if PER_LAYER_EMBEDDING_TENSOR in tensors:
        fields["per_layer_embeddings"] = _per_layer_embeddings(meta, tensors, arch, layers, read_int, source)
    shared = read_int(f"{arch}.attention.shared_kv_layers", 0) or 0
    if shared:
        pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
        if not isinstance(pattern, list) or len(pattern) != layers:
            raise ConfigurationError(f"{source}: {arch}.attention.shared_kv_layers is set but the per-layer "
                                     "sliding_window_pattern is not, so which shared layers are local is unknown")
        fields["num_kv_shared_layers"] = shared
        fields["num_kv_shared_local_layers"] = sum(bool(v) for v in pattern[layers - shared:])
    altup = read_int(f"{arch}.altup.num_inputs", 1) or 1
    if altup > 1:
        fields["altup_num_inputs"] = altup
    laurel = tensors.get("blk.0.laurel_l.weight")
    if laurel is not None and len(laurel.dims) == 2 and laurel.dims[0] == d:
        fields["laurel_rank"] = laurel.dims[1]
    return fields


def _linear_attention(arch: str, read_int, source: str) -> LinearAttention:
    keys = {"conv_kernel_dim": "ssm.conv_kernel", "key_head_dim": "ssm.state_size", "num_key_heads": "ssm.group_count",
            "num_value_heads": "ssm.time_step_rank", "full_attention_interval": "full_attention_interval"}
    values = {field: read_int(f"{arch}.{key}", None) for field, key in keys.items()}
    inner = read_int(f"{arch}.ssm.inner_size", None)
    missing = [f"{arch}.{keys[f]}" for f, v in values.items() if not v] + ([] if inner else [f"{arch}.ssm.inner_size"])
    if missing:
        raise ConfigurationError(f"{source}: the Gated DeltaNet layers need {', '.join(missing)}, which the metadata "
                                 "lacks")
    if inner % values["num_value_heads"]:
        raise ConfigurationError(f"{source}: {arch}.ssm.inner_size={inner} is not a multiple of "
                                 f"ssm.time_step_rank={values['num_value_heads']} value heads")
    return LinearAttention(value_head_dim=inner // values["num_value_heads"], **values)


def _per_layer_embeddings(meta: dict, tensors: dict, arch: str, layers: int, read_int,
                          source: str) -> PerLayerEmbeddings:
    table = tensors[PER_LAYER_EMBEDDING_TENSOR]
    width = read_int(f"{arch}.embedding_length_per_layer_input", None)
    if len(table.dims) != 2 or not width or table.dims[0] != layers * width:
        raise ConfigurationError(f"{source}: {PER_LAYER_EMBEDDING_TENSOR} has shape {table.dims}, not "
                                 f"(block_count x embedding_length_per_layer_input = {layers} x {width}, vocab)")
    return PerLayerEmbeddings(hidden_size_per_layer_input=width, vocab_size_per_layer_input=table.dims[1])
