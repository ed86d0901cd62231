"""Read a GGUF checkpoint (one file, or every part of a split one) into a :class:`StoredModelSpec`.

Only the header is read: metadata and the tensor table (name, shape, ggml type, offset). Tensor
data is never touched; the file is memory-mapped and only the header pages are read. The header is
walked here rather than with ``gguf.GGUFReader``, which builds a numpy view per element of every
metadata array (about 6 s for a 150k-token vocabulary on a small machine); the ``gguf`` package still
supplies the ggml type table (block size and bytes per block of each quantization type), so the
bytes of every tensor are exactly what the file stores: a Q4_K_M file's Q4_K and Q6_K tensors each
at their own size. The tests check this reader against ``gguf.GGUFReader``.

The shapes come from the ``<arch>.*`` metadata keys (llama.cpp's names) and the tensor table; the
bytes per part reach the estimate as described in :mod:`estimator.specs.stored`.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from estimator.errors import ConfigurationError, describe_validation_error
from estimator.specs.formats import weight_format
from estimator.specs.gguf_mechanisms import PER_LAYER_EMBEDDING_TENSOR, mechanism_fields, refuse_recurrent
from estimator.specs.model import MLA, ModelSpec, MoE, Shape
from estimator.specs.stored import ParamCounter, PartBytes, StoredModelSpec, cached_reader, stored_spec

GGUF_MAGIC = b"GGUF"
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
MAX_DIMS = 4                 # GGML_MAX_DIMS
SMALL_ARRAY = 4096           # metadata arrays longer than this (vocabularies) are skipped, only their length kept
# Architectures whose metadata maps onto Shape, and which of their layers attend within
# <arch>.attention.sliding_window (llama.cpp src/llama-model.cpp): "none" (the key, if any, is not
# used), "all", or n: every n-th layer is global, the others local.
ARCHITECTURES: dict[str, str | int] = {
    "llama": "none", "mistral3": "none", "qwen2": "none", "qwen3": "none", "qwen2moe": "none", "qwen3moe": "none",
    "gemma": "none", "gemma2": 2, "gemma3": 6, "cohere2": 4, "gpt-oss": 2, "phi3": "all", "command-r": "none",
    "granite": "none", "granitemoe": "none", "olmo2": "none", "olmoe": "none", "starcoder2": "none",
    "falcon": "none", "internlm2": "none", "stablelm": "none", "exaone": "none", "glm4": "none", "glm4moe": "none",
    "smollm3": "none", "deepseek2": "none", "deepseek32": "none", "qwen3next": "none", "gemma3n": 5,
}   # the last three with mechanisms read by estimator.specs.gguf_mechanisms
NATIVE_TYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]      # ggml order: dims[0] is the row length
    type_name: str
    offset: int                # from the start of the data section
    elements: int
    n_bytes: int


@dataclass(frozen=True)
class ArrayInfo:
    """A long metadata array (a vocabulary): only its length is kept."""

    length: int


class _Corrupt(Exception):
    pass


class _Cursor:
    """Bounds-checked little-endian reads from the memory-mapped header."""

    def __init__(self, data, size: int):
        self.data, self.size, self.pos = data, size, 0

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > self.size:
            raise _Corrupt(f"the header ends early (needs byte {self.pos + n:,} of {self.size:,})")
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: str):
        return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.unpack("Q")).decode("utf-8", errors="replace")


def _value_types():
    from gguf.constants import GGUFValueType as T
    scalars = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
               T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}
    return T, scalars


def _value(cur: _Cursor, vtype: int, types):
    T, scalars = types
    try:
        kind = T(vtype)
    except ValueError:
        raise _Corrupt(f"unknown metadata value type {vtype}") from None
    if kind in scalars:
        return cur.unpack(scalars[kind])
    if kind == T.STRING:
        return cur.string()
    if kind != T.ARRAY:
        raise _Corrupt(f"unhandled metadata value type {kind.name}")
    item, length = cur.unpack("I"), cur.unpack("Q")
    if length <= SMALL_ARRAY:
        return [_value(cur, item, types) for _ in range(length)]
    if T(item) in scalars:
        cur.take(length * struct.calcsize(scalars[T(item)]))
    else:
        for _ in range(length):
            _value(cur, item, types)
    return ArrayInfo(length)


def _tensor(cur: _Cursor) -> TensorInfo:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    name = cur.string()
    n_dims = cur.unpack("I")
    if not 1 <= n_dims <= MAX_DIMS:
        raise _Corrupt(f"tensor {name!r} has {n_dims} dimensions")
    dims = tuple(cur.unpack("Q") for _ in range(n_dims))
    raw, offset = cur.unpack("I"), cur.unpack("Q")
    try:
        kind = GGMLQuantizationType(raw)
    except ValueError:
        import gguf
        raise _Corrupt(f"tensor {name!r} has ggml type {raw}, unknown to gguf {getattr(gguf, '__version__', '')} "
                       "(`pip install -U gguf` may know it)") from None
    block, per_block = GGML_QUANT_SIZES[kind]
    elements = 1
    for d in dims:
        elements *= d
    if dims[0] % block:
        raise _Corrupt(f"tensor {name!r}: rows of {dims[0]} are not whole {kind.name} blocks of {block}")
    return TensorInfo(name, dims, kind.name, offset, elements, elements // block * per_block)


def read_header(path: str | Path) -> tuple[dict, list[TensorInfo]]:
    """Metadata and tensor table of one GGUF file; a corrupt or truncated file is a ConfigurationError."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = path.stat().st_size
            if size < 24:
                raise _Corrupt(f"{size} bytes is too short for a GGUF header")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return _parse(_Cursor(data, size))
    except OSError as exc:
        raise ConfigurationError(f"cannot read GGUF file {path}: {exc.strerror or exc}") from None
    except _Corrupt as exc:
        raise ConfigurationError(f"{path} is not a valid GGUF file: {exc}") from None


def _parse(cur: _Cursor) -> tuple[dict, list[TensorInfo]]:
    if cur.take(4) != GGUF_MAGIC:
        raise _Corrupt("it does not start with the GGUF magic bytes")
    version = cur.unpack("I")
    if version not in (2, 3):
        raise _Corrupt(f"version {version} (big-endian or unsupported; readable: 2, 3)")
    n_tensors, n_kv = cur.unpack("Q"), cur.unpack("Q")
    if n_tensors > 10_000_000 or n_kv > 1_000_000:
        raise _Corrupt(f"implausible counts ({n_tensors:,} tensors, {n_kv:,} keys)")
    types = _value_types()
    meta = {}
    for _ in range(n_kv):
        key = cur.string()
        meta[key] = _value(cur, cur.unpack("I"), types)
    tensors = [_tensor(cur) for _ in range(n_tensors)]
    alignment = meta.get("general.alignment", 32)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise _Corrupt(f"general.alignment {alignment!r} is not a power of two")
    start = -(-cur.pos // alignment) * alignment
    for t in tensors:
        end = start + t.offset + t.n_bytes
        if end > cur.size:
            raise _Corrupt(f"truncated: tensor {t.name!r} ends at byte {end:,} but the file has {cur.size:,}")
    return meta, tensors


def split_parts(path: str | Path) -> list[Path]:
    """Every part of a split GGUF (``name-00001-of-00003.gguf``), given any one of them."""
    path = Path(path)
    match = SPLIT_NAME.match(path.name)
    if not match:
        return [path]
    count = int(match["count"])
    parts = [path.with_name(f"{match['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        raise ConfigurationError(f"{path.name} is part of a {count}-part GGUF, but {', '.join(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} missing from {path.parent}")
    return parts


def _read_parts(parts: list[Path]) -> tuple[dict, list[TensorInfo]]:
    meta, tensors = read_header(parts[0])
    for part in parts[1:]:
        tensors += read_header(part)[1]
    expected = meta.get("split.tensors.count")
    if expected is not None and expected != len(tensors):
        raise ConfigurationError(f"{parts[0]}: the split GGUF declares {expected} tensors but its "
                                 f"{len(parts)} parts hold {len(tensors)}")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"{parts[0]}: a tensor name appears twice across the parts")
    return meta, tensors


def _part_of(name: str) -> str:
    if name.startswith("token_embd.") or name == PER_LAYER_EMBEDDING_TENSOR:   # both read by rows
        return "embedding"
    if name.startswith("output."):
        return "head"
    if "_exps." in name or re.search(r"\.ffn_(gate|up|down)\.\d+\.", name):   # merged, or older per-expert tensors
        return "experts"
    return "other"


def _is_weight_matrix(t: TensorInfo) -> bool:
    return len(t.dims) >= 2 and "norm" not in t.name


def part_bytes(tensors: list[TensorInfo], layers: int) -> PartBytes:
    """Bytes per part; blocks past ``layers`` (next-token-prediction layers) are left out and named."""
    parts = PartBytes()
    split_kv = {_layer_of(t.name) for t in tensors if ".attn_k_b." in t.name}
    for t in tensors:
        layer = _layer_of(t.name)
        if layer is not None and layer >= layers:
            parts.skipped["multi-token-prediction layers"] = parts.skipped.get("multi-token-prediction layers", 0) \
                + t.n_bytes
            continue
        elements = t.elements if _is_weight_matrix(t) else 0
        if ".attn_kv_b." in t.name and layer in split_kv:   # MLA files may keep kv_b beside its k_b/v_b split
            elements = 0
        parts.add(_part_of(t.name), t.type_name, t.n_bytes, elements)
    return parts


def _int(meta: dict, key: str, source: str, default=None) -> int | None:
    value = meta.get(key, default)
    if isinstance(value, list):   # per-layer values: equal in every layer, or not representable
        if value and all(v == value[0] for v in value):
            return value[0]
        raise ConfigurationError(f"{source}: {key} differs between layers ({sorted(set(value))}); per-layer shapes "
                                 "(such as a MatFormer mix-n-match sub-model's feed-forward widths) are not modelled")
    if value is not None and not isinstance(value, (int, float)):
        raise ConfigurationError(f"{source}: {key} is {value!r}, expected a number")
    return None if value is None else int(value)


def _float(meta: dict, key: str) -> float | None:
    """A positive scalar such as a soft-cap, or None where the key is absent or zero (no cap)."""
    value = meta.get(key)
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def _mlp_matrices(tensors: list[TensorInfo], d: int, width: int, experts: int, dense_layer: int | None) -> int:
    """3 for a gated MLP, 2 for a plain one, from the weights of one layer's feed-forward tensors."""
    prefix = f"blk.{dense_layer if dense_layer is not None else _first_moe_layer(tensors)}."
    routed = dense_layer is None
    weights = sum(t.elements for t in tensors if t.name.startswith(prefix) and ".ffn_" in t.name and
                  _is_weight_matrix(t) and ("_exps" in t.name) == routed and "shexp" not in t.name
                  and "gate_inp" not in t.name)
    return round(weights / (d * width * (experts if routed else 1)))


def _layer_of(name: str) -> int | None:
    match = re.match(r"blk\.(\d+)\.", name)
    return int(match[1]) if match else None


def _first_moe_layer(tensors: list[TensorInfo]) -> int:
    return min(_layer_of(t.name) for t in tensors if _part_of(t.name) == "experts")


def _window(meta: dict, arch: str, layers: int, source: str) -> tuple[int | None, int]:
    window = _int(meta, f"{arch}.attention.sliding_window", source)
    rule = ARCHITECTURES[arch]
    if not window or rule == "none":
        return None, 0
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):   # per-layer flags: true where the layer is local
        return window, sum(bool(v) for v in pattern)
    if isinstance(pattern, int) and pattern > 0:
        rule = pattern
    return window, layers if rule == "all" else layers - layers // int(rule)


def _mla(meta: dict, arch: str, source: str) -> MLA | None:
    rank = _int(meta, f"{arch}.attention.kv_lora_rank", source)
    if not rank:
        return None
    rope = _int(meta, f"{arch}.rope.dimension_count", source)
    key = _int(meta, f"{arch}.attention.key_length_mla", source) or _int(meta, f"{arch}.attention.key_length", source)
    value = (_int(meta, f"{arch}.attention.value_length_mla", source)
             or _int(meta, f"{arch}.attention.value_length", source))
    return MLA(kv_lora_rank=rank, q_lora_rank=_int(meta, f"{arch}.attention.q_lora_rank", source) or None,
               qk_rope_head_dim=rope, qk_nope_head_dim=key - rope, v_head_dim=value)


def _moe(meta: dict, arch: str, tensors: list[TensorInfo], layers: int, d_ff: int, source: str) -> MoE | None:
    experts = _int(meta, f"{arch}.expert_count", source, 0)
    if experts <= 1:
        return None
    moe_layers = {_layer_of(t.name) for t in tensors if _part_of(t.name) == "experts"}
    shared = _int(meta, f"{arch}.expert_shared_count", source) or int(any("shexp" in t.name for t in tensors))
    return MoE(num_experts=experts, experts_per_token=_int(meta, f"{arch}.expert_used_count", source),
               expert_intermediate_size=_int(meta, f"{arch}.expert_feed_forward_length", source) or d_ff,
               num_shared_experts=shared,
               shared_expert_intermediate_size=_int(meta, f"{arch}.expert_shared_feed_forward_length", source),
               num_dense_layers=layers - len(moe_layers))


def _shape(meta: dict, tensors: list[TensorInfo], source: str) -> tuple[str, Shape]:
    arch = meta.get("general.architecture")
    if isinstance(arch, str):
        refuse_recurrent(arch, source)
    if not isinstance(arch, str) or arch not in ARCHITECTURES:
        raise ConfigurationError(f"{source}: GGUF architecture {arch!r} is not supported; supported: "
                                 f"{', '.join(sorted(ARCHITECTURES))}")
    try:
        return arch, _arch_shape(meta, tensors, source, arch)
    except (ValueError, TypeError, ZeroDivisionError) as exc:   # pydantic's ValidationError is a ValueError
        why = describe_validation_error(exc) if isinstance(exc, ValidationError) else exc
        raise ConfigurationError(f"{source}: the GGUF metadata gives inconsistent shapes: {why}") from None


def _arch_shape(meta: dict, tensors: list[TensorInfo], source: str, arch: str) -> Shape:
    names = {t.name: t for t in tensors}
    if "token_embd.weight" not in names:
        raise ConfigurationError(f"{source}: no token_embd.weight tensor; not a complete {arch} model")
    d = _int(meta, f"{arch}.embedding_length", source)
    mtp_layers = _int(meta, f"{arch}.nextn_predict_layers", source) or 0   # GLM-4.5: counted in block_count
    layers = (_int(meta, f"{arch}.block_count", source) or 0) - mtp_layers
    tensors = [t for t in tensors if (_layer_of(t.name) or 0) < layers]
    heads = _int(meta, f"{arch}.attention.head_count", source)
    if not (d and layers and heads):
        raise ConfigurationError(f"{source}: the metadata lacks {arch}.embedding_length, block_count or "
                                 "attention.head_count")
    d_ff = _int(meta, f"{arch}.feed_forward_length", source) or 4 * d
    mla = _mla(meta, arch, source)
    moe = _moe(meta, arch, tensors, layers, d_ff, source)
    dense_layer = next((i for i in range(layers) if moe is None or i not in
                        {_layer_of(t.name) for t in tensors if _part_of(t.name) == "experts"}), None)
    width = d_ff if dense_layer is not None else moe.expert_intermediate_size
    n_mat = _mlp_matrices(tensors, d, width, moe.num_experts if moe else 1, dense_layer)
    if n_mat not in (2, 3):
        raise ConfigurationError(f"{source}: the feed-forward tensors hold {n_mat} × d × d_ff weights per layer; "
                                 "expected 2 (plain) or 3 (gated)")
    window, local = _window(meta, arch, layers, source)
    embd = names["token_embd.weight"]
    if len(embd.dims) != 2 or embd.dims[0] != d:
        raise ConfigurationError(f"{source}: token_embd.weight has shape {embd.dims}, "
                                 f"not (embedding_length={d}, vocab)")
    return Shape(
        hidden_size=d, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=heads if mla else _int(meta, f"{arch}.attention.head_count_kv", source, heads),
        head_dim=(mla.qk_nope_head_dim + mla.qk_rope_head_dim) if mla else
        _int(meta, f"{arch}.attention.key_length", source, d // heads),
        intermediate_size=d_ff, vocab_size=embd.dims[1], tie_word_embeddings="output.weight" not in names,
        max_context=_int(meta, f"{arch}.context_length", source, 2048), mlp_gated=n_mat == 3,
        sliding_window=window, num_local_layers=local, moe=moe, mla=mla,
        attention_logit_softcap=_float(meta, f"{arch}.attn_logit_softcapping"),
        **mechanism_fields(meta, names, arch, layers, d, lambda key, default: _int(meta, key, source, default), source))


def _label(meta: dict, parts: PartBytes) -> str:
    from gguf.constants import LlamaFileType

    try:
        return LlamaFileType(meta["general.file_type"]).name.removeprefix("MOSTLY_").removeprefix("ALL_")
    except (KeyError, ValueError):
        return max(parts.by_type.items(), key=lambda kv: kv[1][1])[0]


@cached_reader
def read_gguf(path: str | Path, counter: ParamCounter) -> StoredModelSpec:
    """A GGUF file (every part, if split) as a spec with its exact stored format.

    ``counter`` is :func:`estimator.physics.params.count_params` (see :mod:`estimator.specs.stored`).
    """
    path = Path(path)
    try:
        exists = path.is_file()
    except (OSError, ValueError) as exc:   # a name too long, or a NUL byte
        raise ConfigurationError(f"GGUF file {str(path)[:80]!r}: not a usable path "
                                 f"({getattr(exc, 'strerror', None) or exc})") from None
    if not exists:
        raise ConfigurationError(f"GGUF file {path} does not exist")
    parts_paths = split_parts(path)
    meta, tensors = _read_parts(parts_paths)
    source = parts_paths[0].name if len(parts_paths) == 1 else f"{parts_paths[0].name} (+{len(parts_paths) - 1} parts)"
    arch, shape = _shape(meta, tensors, source)
    parts = part_bytes(tensors, shape.num_layers)
    name = meta.get("general.name") if isinstance(meta.get("general.name"), str) else None
    name = name or SPLIT_NAME.sub(r"\g<stem>", parts_paths[0].name).removesuffix(".gguf")
    spec = ModelSpec(name=name, hf_id=name, family=arch, shape=shape,
                     config_source=f"file://{parts_paths[0].resolve()}",
                     notes=f"read from the GGUF header of {source}")
    label = _label(meta, parts)
    quantized = any(t not in NATIVE_TYPES for t, (_, n) in parts.by_type.items() if n > parts.total * 0.05)
    template = weight_format("Q8_0" if quantized else NATIVE_TYPES.get(label, "f16"))
    return stored_spec(spec, parts, counter, template, f"GGUF {label}", source, [str(p) for p in parts_paths])
