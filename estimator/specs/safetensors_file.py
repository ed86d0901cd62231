"""Read a Hugging Face checkpoint folder (config.json + safetensors) into a :class:`StoredModelSpec`.

Shapes come from ``config.json`` (:mod:`estimator.specs.config_json`). Bytes come from the
safetensors headers only: an 8-byte little-endian header length, then a JSON header that gives
each tensor's dtype, shape and byte range (safetensors format, huggingface/safetensors README).
No tensor is loaded. A quantized checkpoint stores packed int32 weights next to their scales,
zero points and group indices (AWQ, GPTQ, compressed-tensors), or FP8 weights with their scales:
every one of those tensors is counted as stored, under the module it belongs to. The
``quantization_config`` only chooses the kernel family and compute dtypes (the closest catalogue
format); the bytes per part reach the estimate as described in :mod:`estimator.specs.stored`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from estimator.errors import ConfigurationError
from estimator.specs.config_json import load_config_json
from estimator.specs.formats import WeightFormat, weight_format
from estimator.specs.stored import ParamCounter, PartBytes, StoredModelSpec, cached_reader, stored_spec

# Bits per element of every safetensors dtype (huggingface/safetensors, safetensors/src/tensor.rs Dtype).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16, "F16": 16,
    "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64, "F4": 4,
    "F6_E2M3": 6, "F6_E3M2": 6,
}
UNQUANTIZED = {"BF16": "bf16", "F16": "f16", "F32": "f32"}
MAX_HEADER_BYTES = 100_000_000    # the safetensors format refuses larger headers
# Tensors of other towers than the text decoder: stored, but not part of the model the estimate times.
OTHER_TOWERS = re.compile(r"(vision_tower|vision_model|visual\.|multi_modal_projector|mm_projector|audio_tower|"
                          r"image_newline|vision_embed|speech_|embed_vision\.|embed_audio\.)")
QUANT_METHODS = ("awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4", "modelopt", "exl2", "exl3",
                 "hqq", "mlx (quantization key)")


def read_header(path: Path) -> dict[str, tuple[str, list[int], int]]:
    """Each tensor's (dtype, shape, stored bytes) from one safetensors header."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if size < 8:
                raise ConfigurationError(f"{path} is not a safetensors file: {size} bytes, no header length")
            length = int.from_bytes(f.read(8), "little")
            if length > MAX_HEADER_BYTES or 8 + length > size:
                raise ConfigurationError(f"{path} is not a valid safetensors file: a header of {length:,} bytes "
                                         f"does not fit in {size:,} bytes (truncated or corrupt)")
            header = json.loads(f.read(length))
    except OSError as exc:
        raise ConfigurationError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"{path} is not a valid safetensors file: its header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ConfigurationError(f"{path} is not a valid safetensors file: its header is not a JSON object")
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ConfigurationError(f"{path}: the header entry of {name!r} lacks dtype, shape or "
                                     "data_offsets") from None
        tensors[name] = (dtype, shape, _check(path, name, dtype, shape, begin, end, size - 8 - length))
    return tensors


def _check(path: Path, name: str, dtype: str, shape: list[int], begin: int, end: int, data_size: int) -> int:
    if dtype not in DTYPE_BITS:
        raise ConfigurationError(f"{path.name}: tensor {name!r} has safetensors dtype {dtype!r}, which this reader "
                                 f"does not know; known: {', '.join(DTYPE_BITS)}")
    elements = 1
    for n in shape:
        elements *= n
    expected = -(-elements * DTYPE_BITS[dtype] // 8)
    if end - begin != expected:
        raise ConfigurationError(f"{path.name}: tensor {name!r} ({dtype} {shape}) should take {expected:,} bytes "
                                 f"but its offsets span {end - begin:,}; the header is corrupt")
    if end > data_size:
        raise ConfigurationError(f"{path} is truncated: tensor {name!r} ends at data byte {end:,} "
                                 f"but the file holds {data_size:,}")
    return end - begin


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a folder: those its index names, else all (a duplicate consolidated.* left out)."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError, AttributeError) as exc:
            raise ConfigurationError(f"{index}: cannot read its weight_map ({exc})") from None
        missing = [n for n in names if not (folder / n).exists()]
        if missing:
            raise ConfigurationError(f"{folder}: {', '.join(missing[:3])} named in {index.name} "
                                     f"{'is' if len(missing) == 1 else 'are'} missing")
        return [folder / n for n in names]
    files = sorted(folder.glob("*.safetensors"))
    hf = [f for f in files if not f.name.startswith("consolidated")]   # Mistral repos ship both layouts
    if not files:
        raise ConfigurationError(f"{folder} holds no .safetensors files")
    return hf or files


def _part_of(name: str, layers: int) -> str:
    if OTHER_TOWERS.search(name):
        return "skip:other towers (vision/audio)"
    layer = re.search(r"layers\.(\d+)\.", name)
    if (layer and int(layer[1]) >= layers) or re.search(r"(^|\.)mtp\.", name):
        return "skip:multi-token-prediction layers"
    if re.search(r"(embed_tokens|wte|word_embeddings|tok_embeddings|embed_tokens_per_layer)\.", name):
        return "embedding"   # a per-layer-embedding table (Gemma 3n) is read by rows too
    if re.search(r"(^|\.)(lm_head|embed_out)\.", name):
        return "head"
    if ".experts." in name:
        return "experts"
    return "other"


def part_bytes(tensors: dict[str, tuple[str, list[int], int]], layers: int, tied: bool) -> PartBytes:
    parts = PartBytes()
    for name, (dtype, shape, n_bytes) in tensors.items():
        part = _part_of(name, layers)
        if part == "head" and tied:
            part = "skip:lm_head copy of the tied embedding"
        if part.startswith("skip:"):
            parts.skipped[part[5:]] = parts.skipped.get(part[5:], 0) + n_bytes
            continue
        matrix = len(shape) >= 2 and "norm" not in name
        parts.add(part, dtype, n_bytes, _elements(shape) if matrix else 0)
    return parts


def _elements(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _compressed(qc: dict) -> tuple[str, str]:
    """compressed-tensors: (catalogue format, label) from the first config group."""
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = (groups[0].get("weights") or {}) if groups else {}
    acts = groups[0].get("input_activations") if groups else None
    bits, kind = weights.get("num_bits", 4), weights.get("type", "int")
    label = f"compressed-tensors {qc.get('format', '')} W{bits}{'A' + str(acts.get('num_bits')) if acts else 'A16'}"
    if kind == "float":
        return ("nvfp4" if bits == 4 else "fp8" if acts else "int8-w8a16"), label
    if bits == 8:
        return ("int8-w8a8" if acts else "int8-w8a16"), label
    return "int4-gptq", label


def quantization_template(cfg: dict, parts: PartBytes, source: str) -> tuple[WeightFormat, str]:
    """The catalogue format whose kernels and compute dtypes the checkpoint uses, and a label for it."""
    text = cfg.get("text_config") or {}
    qc = cfg.get("quantization_config") or cfg.get("compression_config") or text.get("quantization_config")
    mlx = cfg.get("quantization")
    if not qc and isinstance(mlx, dict) and "bits" in mlx:
        group = mlx.get("group_size", 64)
        return weight_format(f"mlx-q{mlx['bits']}-g{group}"), f"MLX {mlx['bits']}-bit g{group}"
    if not qc:
        dtype = max(parts.by_type.items(), key=lambda kv: kv[1][1])[0]
        if dtype not in UNQUANTIZED:
            raise ConfigurationError(f"{source}: most bytes are {dtype} but config.json has no quantization_config "
                                     "saying how they are quantized")
        return weight_format(UNQUANTIZED[dtype]), dtype
    method = str(qc.get("quant_method", "")).lower()
    bits = qc.get("bits") or qc.get("w_bit") or qc.get("wbits") or 4
    group = qc.get("group_size") or qc.get("q_group_size")
    if method in ("awq", "gptq"):
        name = f"int4-{method}" if bits == 4 else "int8-w8a16"
        return weight_format(name), f"{method.upper()} int{bits}" + (f" g{group}" if group else "")
    if method in ("fp8", "fbgemm_fp8"):
        return weight_format("fp8"), "FP8"
    if method == "compressed-tensors":
        name, label = _compressed(qc)
        return weight_format(name), label
    if method == "bitsandbytes":
        if qc.get("load_in_4bit") or qc.get("_load_in_4bit"):
            name = "nf4" if qc.get("bnb_4bit_use_double_quant") else "nf4-nodq"
            return weight_format(name), f"bitsandbytes {qc.get('bnb_4bit_quant_type', 'nf4')}"
        return weight_format("bnb-int8"), "bitsandbytes int8"
    if method == "mxfp4":
        return weight_format("mxfp4-experts"), "MXFP4"
    if method == "modelopt":
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo", "")).upper()
        return weight_format("nvfp4" if "FP4" in algo else "fp8"), f"ModelOpt {algo or 'FP8'}"
    if method in ("exl2", "exl3"):
        return weight_format(f"{method}-{bits}bpw"), f"{method.upper()} {bits} bpw"
    if method == "hqq":
        return weight_format(f"hqq-{qc.get('nbits', bits)}bit-g{group or 64}"), "HQQ"
    raise ConfigurationError(f"{source}: quantization method {method!r} in config.json is not supported; supported: "
                             f"{', '.join(QUANT_METHODS)} (or pass config.json alone with --format)")


@cached_reader
def read_safetensors_folder(folder: str | Path, counter: ParamCounter) -> StoredModelSpec:
    """A checkpoint folder as a spec with its exact stored format.

    ``counter`` is :func:`estimator.physics.params.count_params` (see :mod:`estimator.specs.stored`).
    """
    folder = Path(folder)
    spec = load_config_json(folder)
    cfg = json.loads((folder / "config.json").read_text())
    files = checkpoint_files(folder)
    tensors: dict = {}
    for path in files:
        for name, entry in read_header(path).items():
            if name in tensors:
                raise ConfigurationError(f"{folder}: tensor {name!r} appears in two safetensors files")
            tensors[name] = entry
    shape = spec.shape
    has_head = any(_part_of(n, shape.num_layers) == "head" for n in tensors)
    if not shape.tie_word_embeddings and not has_head:   # no lm_head stored: the engine ties it
        spec = spec.model_copy(update={"shape": shape.model_copy(update={"tie_word_embeddings": True})})
    parts = part_bytes(tensors, shape.num_layers, spec.shape.tie_word_embeddings)
    source = folder.name or str(folder)
    template, label = quantization_template(cfg, parts, source)
    unquantized = set(parts.by_type) <= set(UNQUANTIZED)
    if not unquantized:
        parts.elements.clear()   # packed weights: stored elements are not parameters
    return stored_spec(spec, parts, counter, template, label, source, [str(p) for p in files], check=unquantized)
