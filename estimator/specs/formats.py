"""Weight and KV-cache formats: bits per element and the data type the math runs in.

Bits per weight include block scales and zero points (docs/formulas.md §1): a group
of g weights with an fp16 scale adds 16/g bits, another 16/g (or 4/g) for a
zero point. Embedding and output head are often kept at higher precision, so
each format states the bits of the linear layers, the output head and the
embedding table separately.

``compute_dtypes`` is an ordered preference: the first dtype the device has a
dense peak for is the one prefill and batched decode run at. Weight-only
formats (W4A16, W8A16, GGUF on GPUs) dequantize to 16 bit and use the bf16/fp16
peak; W8A8 and FP8/FP4 formats use the low-precision tensor cores where the
device has them, and fall back to 16-bit math where it does not (e.g. FP8
checkpoints on A100 run as W8A16 Marlin kernels in vLLM).

``dequant`` names the kernel family; the default efficiency table
(:mod:`estimator.efficiency.defaults`) gives each family its fraction of peak bandwidth,
since dequantizing kernels reach a lower fraction than plain 16-bit GEMVs.

Some names carry their parameters and are built on lookup (:data:`PARAMETRIC`):
``exl2-4.65bpw``, ``exl3-4.0bpw``, any ``<N>bpw``, ``mlx-q4-g32``, ``hqq-4bit-g128``.
A checkpoint read from disk gets a format of its own whose bits reproduce its stored
bytes part by part (``dense_linear_bits``, ``expert_linear_bits``; see
:mod:`estimator.specs.stored`).
"""

from __future__ import annotations

import re

from pydantic import Field

from estimator.errors import UnknownNameError
from estimator.specs.sourced import Frozen

F16_FALLBACK = ("bf16", "fp16", "fp32")
GGUF_QUANTIZE_README = "https://github.com/ggml-org/llama.cpp/blob/master/tools/quantize/README.md"
GGML_BLOCKS = "https://github.com/ggml-org/llama.cpp/blob/master/ggml/src/ggml-common.h"


class WeightFormat(Frozen):
    """How weights are stored and which compute they use."""

    name: str
    aliases: tuple[str, ...] = ()
    linear_bits: float = Field(gt=0, description="bits per weight of the transformer's linear layers, scales included")
    experts_only: bool = Field(default=False, description="quantizes only routed MoE experts; other linear layers stay 16-bit")
    head_bits: float = Field(gt=0, description="bits per weight of the output head")
    embedding_bits: float = Field(gt=0, description="bits per weight of the input embedding table")
    compute_dtypes: tuple[str, ...] = Field(description="preferred compute dtypes, first available wins")
    dequant: str = Field(description="kernel family: native | weight_only | gguf | fp4")
    basis: str = Field(description="where the bit count comes from")
    dense_linear_bits: float | None = Field(
        default=None, gt=0, description="bits of the always-streamed linear weights (attention, dense MLPs, shared "
                                        "experts, routers) where they differ from linear_bits (a checkpoint on disk)")
    expert_linear_bits: float | None = Field(
        default=None, gt=0,
        description="bits of the routed experts where they differ from linear_bits (a checkpoint on disk)")

    @property
    def dense_bits(self) -> float:
        """Bits per weight of the linear layers every token uses (β_dense, docs/formulas.md §1)."""
        if self.dense_linear_bits is not None:
            return self.dense_linear_bits
        return 16.0 if self.experts_only else self.linear_bits

    @property
    def expert_bits(self) -> float:
        """Bits per weight of the routed experts (β_expert, docs/formulas.md §1)."""
        return self.linear_bits if self.expert_linear_bits is None else self.expert_linear_bits


class KVFormat(Frozen):
    """How KV-cache entries are stored."""

    name: str
    aliases: tuple[str, ...] = ()
    bits: float = Field(gt=0)
    basis: str


def _float(name: str, bits: int, dtypes: tuple[str, ...], aliases: tuple[str, ...]) -> WeightFormat:
    return WeightFormat(name=name, aliases=aliases, linear_bits=bits, head_bits=bits, embedding_bits=bits,
                        compute_dtypes=dtypes, dequant="native", basis=f"{bits}-bit IEEE/bfloat storage")


def _gguf(name: str, linear_bits: float, basis: str, head_bits: float = 6.5625) -> WeightFormat:
    # llama.cpp keeps output.weight at Q6_K for the k-quant and Q4_0 mixes (llama-quant.cpp);
    # its CUDA/Metal matmuls dequantize to f16 for prompt processing.
    return WeightFormat(name=name, aliases=(name.lower().replace("_", "-"),), linear_bits=linear_bits,
                        head_bits=head_bits, embedding_bits=linear_bits, compute_dtypes=F16_FALLBACK,
                        dequant="gguf", basis=basis)


# QLoRA double quantization: 8-bit absmax per 64 weights, an fp32 constant per 256 absmax values.
NF4_DQ_BITS = 4 + 8 / 64 + 32 / (64 * 256)
# -b (target average bits per weight) and -hb (head bits) as each converter documents its arguments.
EXL2_DOC = "https://github.com/turboderp/exllamav2, convert.py -b/-hb"
EXL3_DOC = "https://github.com/turboderp-org/exllamav3, convert.py -b/-hb"
MLC_QUANTIZATION = ("https://github.com/mlc-ai/mlc-llm/blob/98d96718b636c06f09be44bf8e25315feb61773c/python/mlc_llm/"
                    "quantization/quantization.py")


def _mlx(bits: int, group: int) -> WeightFormat:
    # mlx.core.quantize (affine mode) stores, per group of `group` weights, a scale and a bias in the model's
    # 16-bit dtype; mlx_lm.convert quantizes every Linear and Embedding, lm_head and the token table included.
    return WeightFormat(
        name=f"mlx-q{bits}" + ("" if group == 64 else f"-g{group}"),
        aliases=(f"mlx-q{bits}-g{group}", f"mlx-{bits}bit"),
        linear_bits=bits + 32 / group, head_bits=bits + 32 / group, embedding_bits=bits + 32 / group,
        compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis=f"MLX affine quantization (mlx.core.quantize, mlx_lm.convert --q-bits {bits} --q-group-size {group}): "
              f"{bits}-bit weights + a 16-bit scale and bias per group of {group} = {bits} + 32/{group} bits; "
              "embedding and lm_head quantized too")


def _hqq(bits: int, group: int) -> WeightFormat:
    # hqq >= 0.2 keeps scale and zero unquantized (quant_zero = quant_scale = False) in fp16, one pair per group.
    return WeightFormat(
        name=f"hqq-{bits}bit" + ("" if group == 64 else f"-g{group}"), aliases=(f"hqq-{bits}bit-g{group}",),
        linear_bits=bits + 32 / group, head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK,
        dequant="weight_only",
        basis=f"HQQ (mobiusml/hqq BaseQuantizeConfig nbits={bits}, group_size={group}): {bits}-bit weights + fp16 "
              f"scale and fp16 zero per group = {bits} + 32/{group} bits; lm_head and embedding 16-bit "
              "(transformers HqqConfig)")


def _exl(version: int, bpw: float) -> WeightFormat:
    # The converter's -b is the target average over the quantized linear layers, scales included;
    # both keep the embedding table unquantized (16-bit).
    head, doc = (6.3, EXL2_DOC) if version == 2 else (6.0, EXL3_DOC)
    head_note = ("lm_head at the default -hb 6, 'about 6.3 bits' mixed precision" if version == 2
                 else "lm_head at the default -hb 6 bits")
    return WeightFormat(
        name=f"exl{version}-{bpw:g}bpw", linear_bits=bpw, head_bits=head, embedding_bits=16,
        compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis=f"EXL{version} at -b {bpw:g}: average bits per weight of the linear layers, scales included; "
              f"{head_note}; embedding 16-bit ({doc})")


def _any_bpw(bpw: float) -> WeightFormat:
    return WeightFormat(
        name=f"{bpw:g}bpw", linear_bits=bpw, head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK,
        dequant="weight_only",
        basis=f"{bpw:g} bits per weight on every linear layer, as given (an average with scales included); "
              "head and embedding 16-bit; dequantized to 16 bit")


_NUMBER = r"(\d+(?:\.\d+)?)"
PARAMETRIC = (   # (pattern on the lower-cased name, builder, what a user writes)
    (re.compile(rf"exl([23])[-_ ]?{_NUMBER}\s*(?:bpw|b)?"), lambda m: _exl(int(m[1]), float(m[2])),
     "exl2-4.65bpw, exl3-4.0bpw"),
    (re.compile(rf"{_NUMBER}\s*-?bpw"), lambda m: _any_bpw(float(m[1])), "<N>bpw (e.g. 3.5bpw)"),
    (re.compile(r"mlx[-_ ]?q?([234568])(?:bit)?(?:[-_ ]?g(32|64|128))?"), lambda m: _mlx(int(m[1]), int(m[2] or 64)),
     "mlx-q4, mlx-q8, mlx-q4-g32"),
    (re.compile(r"hqq[-_ ]?([1-8])[-_ ]?(?:bits?|b)?(?:[-_ ]?g(\d+))?"), lambda m: _hqq(int(m[1]), int(m[2] or 64)),
     "hqq-4bit, hqq-4bit-g128"),
)


def parametric_weight_format(name: str) -> WeightFormat | None:
    """A format whose name carries its parameters (``exl2-4.65bpw``, ``mlx-q4-g32``), or None."""
    key = name.strip().lower()
    for pattern, build, _ in PARAMETRIC:
        match = pattern.fullmatch(key)
        if match:
            try:
                found = build(match)
            except ValueError:   # pydantic refuses 0 bits
                found = None
            if found is None or found.linear_bits > 32:
                raise UnknownNameError(f"weight format {name!r}: bits per weight must be above 0 and at most 32")
            return found
    return None


WEIGHT_FORMATS: tuple[WeightFormat, ...] = (
    _float("f32", 32, ("fp32",), ("fp32", "float32")),
    _float("f16", 16, ("fp16", "bf16", "fp32"), ("fp16", "float16", "half")),
    _float("bf16", 16, ("bf16", "fp16", "fp32"), ("bfloat16",)),
    WeightFormat(
        name="fp8", aliases=("w8a8-fp8", "fp8-e4m3", "float8"), linear_bits=8 + 16 / 4096, head_bits=16,
        embedding_bits=16, compute_dtypes=("fp8", "bf16", "fp16", "fp32"), dequant="native",
        basis="e4m3 weights with a per-channel fp16 scale (negligible); lm_head and embedding stay bf16 "
              "(vLLM/ModelOpt FP8 checkpoints); devices without fp8 run W8A16 at 16-bit compute"),
    WeightFormat(
        name="int8-w8a8", aliases=("w8a8", "w8a8-int8", "smoothquant"), linear_bits=8 + 16 / 4096,
        head_bits=16, embedding_bits=16, compute_dtypes=("int8", "bf16", "fp16", "fp32"), dequant="native",
        basis="int8 weights and activations with per-channel scales (SmoothQuant, arXiv 2211.10438)"),
    WeightFormat(
        name="int8-w8a16", aliases=("w8a16", "int8", "int8-weight-only"), linear_bits=8 + 16 / 4096,
        head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="int8 weights, per-channel scale, dequantized to 16 bit (gpt-fast int8, bitsandbytes LLM.int8 storage)"),
    WeightFormat(
        name="int4-awq", aliases=("awq", "w4a16", "int4", "int4-w4a16"), linear_bits=4 + 16 / 128 + 4 / 128,
        head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="4-bit weights, group 128, fp16 scale + packed 4-bit zero per group = 4.156 bits "
              "(AWQ, arXiv 2306.00978); head and embedding fp16"),
    WeightFormat(
        name="q4f16_1", aliases=("mlc-q4f16_1", "q4f16_0", "mlc-q4f16_0"), linear_bits=4 + 16 / 32,
        head_bits=4 + 16 / 32, embedding_bits=4 + 16 / 32, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="MLC-LLM group quantization: int4 weights with an fp16 scale per group of 32 = 4.5 bits, embedding "
              "and final FC quantized too (quantize_embedding, quantize_final_fc; q4f16_0 differs in layout only) "
              f"({MLC_QUANTIZATION})"),
    WeightFormat(
        name="q4f16_ft", aliases=("mlc-q4f16_ft",), linear_bits=4 + 16 / 4096, head_bits=4 + 16 / 32,
        embedding_bits=4 + 16 / 32, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="MLC-LLM FasterTransformer quantization: int4 linear weights with one fp16 scale per output channel "
              "over K >= 4,096 inputs (<= 4.004 bits); the final FC and the embedding fall back to the 4.5-bit "
              f"group quantization ({MLC_QUANTIZATION}, ft_quantization.py)"),
    WeightFormat(
        name="int4-gptq", aliases=("gptq", "gptq-int4"), linear_bits=4 + 16 / 128 + 4 / 128,
        head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="4-bit weights, group 128, fp16 scale + packed 4-bit zero per group (GPTQ, arXiv 2210.17323)"),
    WeightFormat(
        name="nvfp4", aliases=("fp4", "nvfp4-w4a4"), linear_bits=4 + 8 / 16, head_bits=16, embedding_bits=16,
        compute_dtypes=("fp4", "fp8", "bf16", "fp16"), dequant="fp4",
        basis="e2m1 values with an fp8 (e4m3) scale per 16 elements = 4.5 bits, plus a negligible per-tensor "
              "fp32 scale (NVIDIA blog 'Introducing NVFP4', 2025-06); head and embedding bf16"),
    WeightFormat(
        name="mxfp4", aliases=("mx-fp4",), linear_bits=4 + 8 / 32, head_bits=16, embedding_bits=16,
        compute_dtypes=("fp4", "bf16", "fp16"), dequant="fp4",
        basis="e2m1 values with an e8m0 scale per 32 elements = 4.25 bits (OCP Microscaling spec v1.0); "
              "head and embedding bf16"),
    WeightFormat(
        name="mxfp4-experts", aliases=("gpt-oss-mxfp4",), linear_bits=4 + 8 / 32, experts_only=True,
        head_bits=16, embedding_bits=16, compute_dtypes=("mxfp8", "bf16", "fp16"), dequant="fp4",
        basis="gpt-oss as released: routed experts in MXFP4 (4.25 bits), attention, router, head and "
              "embedding in bf16 (OpenAI gpt-oss model card, 2025-08). Served with MXFP8 activations on "
              "Blackwell, BF16 on Hopper (TensorRT-LLM's gpt-oss deployment guide, MoE backend matrix: "
              "TRTLLM MXFP8 x MXFP4 on B200/GB200/B300/GB300, TRITON BF16 x MXFP4 on H200), so its expert "
              "GEMMs run at the FP8 rate, not the FP4 one"),
    WeightFormat(
        name="MXFP4_MOE", aliases=("mxfp4-moe", "gguf-mxfp4"), linear_bits=4 + 8 / 32, experts_only=True,
        dense_linear_bits=8.5, head_bits=8.5, embedding_bits=8.5, compute_dtypes=F16_FALLBACK, dequant="gguf",
        basis="llama.cpp's MXFP4_MOE file type (ggml-org/gpt-oss-*-GGUF): 3-D expert tensors in MXFP4 "
              "(4.25 bits), every other tensor, output head and embedding included, in Q8_0 (8.5 bits) "
              "(llama_tensor_get_type in src/llama-quant.cpp); reproduces the files' 11.27 and 59.02 GiB "
              "(docs/formulas.md §1)"),
    _gguf("Q8_0", 8.5, f"block of 32 int8 + fp16 scale = 34 bytes ({GGML_BLOCKS})", head_bits=8.5),
    _gguf("Q6_K", 6.5625, f"super-block of 256 = 210 bytes ({GGML_BLOCKS}); file-level 6.56 bpw for Llama-2-7B ({GGUF_QUANTIZE_README})"),
    _gguf("Q5_K_M", 5.68, f"Q5_K (5.5 bpw) with some tensors in Q6_K: 5.68 bpw for Llama-2-7B ({GGUF_QUANTIZE_README})"),
    _gguf("Q4_K_M", 4.84, f"Q4_K (4.5 bpw) with half of attn_v/ffn_down in Q6_K: 4.84 bpw for Llama-2-7B ({GGUF_QUANTIZE_README})"),
    _gguf("Q4_0", 4.5, f"block of 32 4-bit + fp16 scale = 18 bytes ({GGML_BLOCKS})"),
    _gguf("Q3_K_M", 3.91, f"Q3_K (3.4375 bpw) mixed with Q4_K/Q5_K: 3.91 bpw for Llama-2-7B ({GGUF_QUANTIZE_README})"),
    _gguf("Q2_K", 3.35, f"Q2_K (2.625 bpw) mixed with Q3_K/Q4_K: 3.35 bpw for Llama-2-7B ({GGUF_QUANTIZE_README})"),
    WeightFormat(
        name="nf4", aliases=("bnb-nf4", "bnb-4bit", "bitsandbytes-nf4", "nf4-dq", "qlora"),
        linear_bits=NF4_DQ_BITS, head_bits=16, embedding_bits=16, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="bitsandbytes NF4 with double quantization (QLoRA, arXiv 2305.14314 §3): 4-bit codes, an absmax per "
              "block of 64 quantized to 8 bits, and an fp32 constant per 256 absmax values = 4 + 8/64 + 32/(64·256) "
              "= 4.127 bits; lm_head and embedding stay 16-bit (transformers skips them); dequantized to bf16"),
    WeightFormat(
        name="nf4-nodq", aliases=("bnb-nf4-nodq", "nf4-no-double-quant"), linear_bits=4 + 32 / 64, head_bits=16,
        embedding_bits=16, compute_dtypes=F16_FALLBACK, dequant="weight_only",
        basis="bitsandbytes NF4 without double quantization (the transformers default): 4-bit codes + fp32 absmax "
              "per block of 64 = 4.5 bits (QLoRA, arXiv 2305.14314 §3); lm_head and embedding 16-bit"),
    WeightFormat(
        name="bnb-int8", aliases=("llm.int8", "llm-int8", "bnb-8bit", "bitsandbytes-int8"),
        linear_bits=8 + 32 / 4096, head_bits=16, embedding_bits=16, compute_dtypes=("int8", "fp16", "bf16", "fp32"),
        dequant="weight_only",
        basis="bitsandbytes LLM.int8() (arXiv 2208.07339): int8 weights + an fp32 scale per output row (SCB), "
              "8 + 32/K bits, K = 4096 taken as a typical input width; int8 matmul with fp16 outlier columns; "
              "lm_head and embedding 16-bit"),
    *(_mlx(bits, 64) for bits in (4, 8)),
    _hqq(4, 64),
)

KV_FORMATS: tuple[KVFormat, ...] = (
    KVFormat(name="f16", aliases=("fp16", "float16", "half", "auto"), bits=16, basis="16-bit cache (vLLM 'auto' for fp16 models)"),
    KVFormat(name="bf16", aliases=("bfloat16",), bits=16, basis="16-bit cache"),
    KVFormat(name="fp8", aliases=("fp8_e4m3", "fp8-e4m3", "fp8_e5m2"), bits=8, basis="vLLM --kv-cache-dtype fp8 (per-tensor scale)"),
    KVFormat(name="int8", aliases=("q8_0",), bits=8.5, basis="int8 with a 16-bit scale per 32 values (llama.cpp q8_0 cache)"),
    KVFormat(name="q4", aliases=("q4_0", "int4"), bits=4.5, basis="4-bit with a 16-bit scale per 32 values (llama.cpp q4_0 cache)"),
)


def _lookup(table: tuple, kind: str, name: str):
    from estimator.specs.database import normalize

    key = normalize(name)
    for entry in table:
        if key in {normalize(entry.name), *map(normalize, entry.aliases)}:
            return entry
    known = ", ".join(e.name for e in table)
    raise UnknownNameError(f"unknown {kind} format {name!r}. Known: {known}.")


def weight_format(name: str) -> WeightFormat:
    """Find a weight format by name or alias, case- and punctuation-insensitively, or by a parametric name.

    Examples
    --------
    How many bits per weight does an EXL2 4.65 bpw quant store, and MLX 4-bit with groups of 32?

    >>> weight_format("exl2-4.65bpw").linear_bits, weight_format("mlx-q4-g32").linear_bits
    (4.65, 5.0)
    """
    try:
        return _lookup(WEIGHT_FORMATS, "weight", name)
    except UnknownNameError as exc:
        found = parametric_weight_format(name)
        if found is None:
            patterns = "; ".join(example for _, _, example in PARAMETRIC)
            raise UnknownNameError(f"{exc} Parametric names: {patterns}.") from None
        return found


# Formats whose kernels are alike, by marks in their names; the first family with a mark in a name wins, so
# MLC's q4f16_1 and q4f16_ft (4-bit weights, fp16 math) are not taken for 16-bit formats.
FORMAT_FAMILIES = (("mlc int4", ("q4f16", "q4f32", "q3f16")), ("16-bit", ("f16", "bf16", "f32")),
                   ("fp8", ("fp8",)), ("fp4", ("fp4",)), ("int8", ("int8",)), ("awq/gptq", ("awq", "gptq")),
                   ("exllama", ("exl2", "exl3")), ("mlx", ("mlx-",)), ("gguf k-quant", ("_k",)),
                   ("gguf legacy", ("q4_0", "q8_0", "q5_0", "q4_1")))


def format_family(name: str) -> str:
    """A weight format's family (:data:`FORMAT_FAMILIES`), by name; "other" for the rest.

    >>> format_family("Q4_K_M"), format_family("mxfp4-experts"), format_family("bf16"), format_family("q4f16_1")
    ('gguf k-quant', 'fp4', '16-bit', 'mlc int4')
    """
    lower = name.lower()
    for family, marks in FORMAT_FAMILIES:
        if any(m in lower for m in marks):
            return family
    return "other"


def kv_format(name: str) -> KVFormat:
    """Find a KV-cache format by name or alias."""
    return _lookup(KV_FORMATS, "KV-cache", name)
