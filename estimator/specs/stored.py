"""A model read from its checkpoint on disk: its shapes, and the exact bytes each part stores.

How exact bytes reach the estimate
----------------------------------
The estimator counts weight bytes as parameters × bits per weight, part by part
(docs/formulas.md §1)::

    W_stored = [P_dense·β_dense + L_moe·E·P_e·β_expert + P_head·β_head·(untied) + V·d·β_emb] / 8 + norms·2

A checkpoint on disk (a GGUF file, a folder of safetensors) knows the bytes of every tensor. Its
reader sums them into four parts: the token embedding, the output head, the routed experts, and
everything else. :func:`exact_weight_format` turns each sum into the bits per weight of that part,
against the same parameter counts the formula multiplies them by::

    β_emb    = bytes(embedding) · 8 / (V·d + V_ple·L·d_ple)   (a per-layer-embedding table joins it)
    β_head   = bytes(head) · 8 / (V·d)                    (β_emb when the head is tied)
    β_expert = bytes(routed experts) · 8 / (L_moe·E·P_e)
    β_dense  = (bytes(everything else) − 2·norms) · 8 / P_dense

The result is an ordinary :class:`~estimator.specs.formats.WeightFormat`, carried by the
:class:`StoredModelSpec` as ``stored_format``: the columns and the physics need no special case,
and ``W_stored`` equals the counted tensor bytes exactly, mixed Q4_K/Q6_K tensors, packed int32
AWQ weights with their scales and zeros, or FP8 with its scales alike. Norm weights, biases and
other small tensors are folded into β_dense, so the total stays exact. ``linear_bits`` is the mean
over dense and routed weights, so a consumer that reads only ``linear_bits`` still stores the exact
total; ``dense_linear_bits`` and ``expert_linear_bits`` keep the split exact for what a step streams.
Kernel family and compute dtypes come from the closest catalogue format (gguf kernels, AWQ/GPTQ
weight-only, FP8 ...). Tensors the text model does not use (a vision tower, multi-token-prediction
layers) are left out, and the format's basis names them.

The parameter counts live in ``estimator.physics`` (a layer above this one), so the caller passes
them in: :func:`estimator.evaluation.api.resolve_model` hands over ``count_params``.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, wraps
from pathlib import Path

from pydantic import Field

from estimator.errors import ConfigurationError
from estimator.formatting import gigabytes
from estimator.specs.formats import WeightFormat
from estimator.specs.model import ModelSpec

# A count_params-like function: ModelSpec -> an object with embedding, per_layer_embedding, head, dense_linear,
# routed_experts and norms (estimator.physics.params.ParamCounts).
ParamCounter = Callable[[ModelSpec], object]
# File and formula parameter counts of one part may differ by biases and rounding, not more.
ELEMENT_TOLERANCE = 0.02


class StoredModelSpec(ModelSpec):
    """A :class:`ModelSpec` read from a checkpoint, with the weight format its files store exactly."""

    stored_format: WeightFormat = Field(description="bits per part that reproduce the checkpoint's bytes exactly")
    stored_weight_bytes: int = Field(ge=0, description="bytes of the tensors counted (the text model's weights)")
    checkpoint_files: list[str] = Field(default_factory=list, description="the files read")


@dataclass
class PartBytes:
    """Bytes (and, where the file says, parameters) of each part of a checkpoint."""

    embedding: int = 0
    head: int = 0
    experts: int = 0
    other: int = 0
    elements: dict[str, int] = field(default_factory=dict)   # 'embedding', 'head', 'experts', 'dense' -> weights
    by_type: dict[str, list[int]] = field(default_factory=dict)   # stored dtype -> [tensors, bytes]
    skipped: dict[str, int] = field(default_factory=dict)         # why left out -> bytes

    def add(self, part: str, dtype: str, n_bytes: int, elements: int | None = None) -> None:
        setattr(self, part, getattr(self, part) + n_bytes)
        count = self.by_type.setdefault(dtype, [0, 0])
        count[0] += 1
        count[1] += n_bytes
        if elements is not None:
            key = "dense" if part == "other" else part
            self.elements[key] = self.elements.get(key, 0) + elements

    @property
    def total(self) -> int:
        return self.embedding + self.head + self.experts + self.other

    def describe(self) -> str:
        types = ", ".join(f"{dtype} {gigabytes(n)} ({tensors} tensors)" for dtype, (tensors, n)
                          in sorted(self.by_type.items(), key=lambda kv: -kv[1][1]))
        text = f"{self.total:,} bytes stored: {types}"
        if self.skipped:
            text += "; left out: " + ", ".join(f"{why} {gigabytes(n)}" for why, n in self.skipped.items())
        return text


def _linear_counts(counts) -> dict[str, int]:
    """Weights per part; a per-layer-embedding table is read by rows like the embedding, so it joins that part."""
    return {"embedding": counts.embedding + counts.per_layer_embedding, "head": counts.head,
            "experts": counts.routed_experts, "dense": counts.dense_linear}


def check_elements(parts: PartBytes, counts, source: str) -> None:
    """The file's weights per part must match the formula's counts, or the shapes were misread."""
    expected = _linear_counts(counts)
    for part, found in parts.elements.items():
        want = expected[part]
        if abs(found - want) > ELEMENT_TOLERANCE * max(want, 1):
            raise ConfigurationError(
                f"{source}: its {part} tensors hold {found:,} weights but the shapes read from its metadata give "
                f"{want:,}; this checkpoint's layout is not understood well enough to count its bytes per part")


def exact_weight_format(spec: ModelSpec, parts: PartBytes, counts, template: WeightFormat, label: str,
                        source: str) -> WeightFormat:
    """Bits per part that make docs/formulas.md §1 reproduce ``parts`` exactly (module docstring)."""
    n = _linear_counts(counts)
    if parts.embedding <= 0 or n["embedding"] <= 0:
        raise ConfigurationError(f"{source}: no token-embedding tensor found; cannot count the embedding's bytes")
    emb_bits = parts.embedding * 8 / n["embedding"]
    head_bits = parts.head * 8 / n["head"] if n["head"] else emb_bits
    dense_bytes = parts.other - 2 * counts.norms
    if dense_bytes <= 0 or n["dense"] <= 0:
        raise ConfigurationError(f"{source}: the non-expert tensors hold {parts.other:,} bytes, too few for "
                                 f"{n['dense']:,} attention and MLP weights; the file does not match its metadata")
    dense_bits = dense_bytes * 8 / n["dense"]
    expert_bits = parts.experts * 8 / n["experts"] if n["experts"] else dense_bits
    if n["experts"] and parts.experts <= 0:
        raise ConfigurationError(f"{source}: the metadata describes routed experts but no expert tensors were found")
    mean_bits = (dense_bytes + parts.experts) * 8 / (n["dense"] + n["experts"])
    basis = (f"exact bytes of {source}: {parts.describe()}; per part: linear {dense_bits:.4g} bits"
             + (f", experts {expert_bits:.4g}" if n["experts"] else "")
             + f", head {head_bits:.4g}, embedding {emb_bits:.4g} (norms, biases and small tensors folded into "
               f"linear); kernels and compute as {template.name}")
    return WeightFormat(
        name=f"{label} (as stored)", linear_bits=mean_bits, experts_only=False, head_bits=head_bits,
        embedding_bits=emb_bits, compute_dtypes=template.compute_dtypes, dequant=template.dequant, basis=basis,
        dense_linear_bits=dense_bits, expert_linear_bits=expert_bits)


def stored_spec(spec: ModelSpec, parts: PartBytes, counter: ParamCounter, template: WeightFormat, label: str,
                source: str, files: list[str], check: bool = True) -> StoredModelSpec:
    """The spec with its exact stored format; ``check`` compares the file's weights per part with the shapes."""
    counts = counter(spec)
    if check:
        check_elements(parts, counts, source)
    fmt = exact_weight_format(spec, parts, counts, template, label, source)
    return StoredModelSpec(**dict(spec), stored_format=fmt, stored_weight_bytes=parts.total, checkpoint_files=files)


def _file_state(path: Path) -> tuple:
    """What identifies the checkpoint's current contents: the files' sizes and modification times."""
    split = re.match(r"(.+)-\d{5}-of-\d{5}\.gguf$", path.name, re.IGNORECASE)
    files = (sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir()
             else sorted(path.parent.glob(f"{glob.escape(split[1])}-*-of-*.gguf")) if split else [path])
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files if p.exists())


def cached_reader(read: Callable[[Path, ParamCounter], StoredModelSpec]):
    """Read each checkpoint once per process while its files are unchanged (``explain`` resolves a model often)."""
    cached = lru_cache(maxsize=16)(lambda path, state, counter: read(Path(path), counter))

    @wraps(read)
    def wrapper(path: str | Path, counter: ParamCounter) -> StoredModelSpec:
        try:
            path, state = Path(path).resolve(), _file_state(Path(path).resolve())
        except (OSError, ValueError):   # unreadable, or a name no file system takes: the reader says why
            return read(Path(path), counter)
        return cached(str(path), state, counter)
    return wrapper
