"""Formats of local runtimes: EXL2/EXL3, any <N>bpw, MLX, bitsandbytes, HQQ; bits per weight against
each format's definition (docs/formulas.md §1: scales and zero points included)."""

from __future__ import annotations

import pytest

from estimator.errors import UnknownNameError
from estimator.specs.formats import WEIGHT_FORMATS, format_family, weight_format


@pytest.mark.parametrize("name, bits", [
    ("exl2-4.65bpw", 4.65), ("exl2-2.5bpw", 2.5), ("EXL2 6bpw", 6.0), ("exl3-4.0bpw", 4.0), ("exl3-3.25bpw", 3.25),
    ("3.5bpw", 3.5), ("5.125 bpw", 5.125),
])
def test_bpw_formats_store_the_named_average(name, bits):
    fmt = weight_format(name)
    assert fmt.linear_bits == bits and fmt.dense_bits == bits and fmt.expert_bits == bits
    assert fmt.embedding_bits == 16 and fmt.dequant == "weight_only" and fmt.compute_dtypes[0] == "bf16"


def test_exllama_head_bits_are_the_converters_default():
    assert weight_format("exl2-4.65bpw").head_bits == 6.3   # -hb 6: "about 6.3 bits" (exllamav2 convert.py docs)
    assert weight_format("exl3-4.0bpw").head_bits == 6.0    # -hb 6 (exllamav3 convert.py docs)
    assert weight_format("4bpw").head_bits == 16


@pytest.mark.parametrize("name, bits, group", [
    ("mlx-q4", 4, 64), ("mlx-q8", 8, 64), ("mlx-q4-g32", 4, 32), ("mlx-q6-g128", 6, 128), ("mlx-q3", 3, 64),
    ("MLX 4bit", 4, 64),
])
def test_mlx_bits_include_a_16_bit_scale_and_bias_per_group(name, bits, group):
    fmt = weight_format(name)
    assert fmt.linear_bits == bits + 32 / group
    assert fmt.head_bits == fmt.embedding_bits == fmt.linear_bits   # mlx_lm quantizes the table and the head


def test_mlx_q4_is_4_5_bits_and_q8_8_5():
    assert weight_format("mlx-q4").linear_bits == 4.5 and weight_format("mlx-q8").linear_bits == 8.5


def test_nf4_with_double_quantization():
    # 4-bit codes; absmax per 64 quantized to 8 bits; an fp32 constant per 256 absmax values (QLoRA §3)
    assert weight_format("nf4").linear_bits == 4 + 8 / 64 + 32 / (64 * 256) == 4.126953125
    assert weight_format("bnb-nf4").name == "nf4"
    assert weight_format("nf4-nodq").linear_bits == 4 + 32 / 64 == 4.5
    assert weight_format("nf4").head_bits == weight_format("nf4").embedding_bits == 16


def test_llm_int8_has_a_32_bit_scale_per_row():
    fmt = weight_format("llm.int8")
    assert fmt.name == "bnb-int8" and fmt.linear_bits == 8 + 32 / 4096 and fmt.compute_dtypes[0] == "int8"


@pytest.mark.parametrize("name, bits, group", [
    ("hqq-4bit", 4, 64), ("hqq-4bit-g64", 4, 64), ("hqq-4bit-g128", 4, 128), ("hqq-2bit-g16", 2, 16),
    ("hqq-3bit", 3, 64),
])
def test_hqq_bits_include_an_fp16_scale_and_zero_per_group(name, bits, group):
    fmt = weight_format(name)
    assert fmt.linear_bits == bits + 32 / group and fmt.head_bits == 16


def test_every_listed_format_states_its_source():
    for fmt in WEIGHT_FORMATS:
        assert len(fmt.basis) > 20, fmt.name


def test_mlc_formats_count_their_scales_and_quantized_head():
    # q4f16_1: int4 + an fp16 scale per 32 everywhere, head and embedding included; q4f16_ft: one fp16 scale per
    # output channel over 4,096 inputs on the linear layers, the head and embedding at q4f16_1's 4.5 bits
    group = weight_format("q4f16_1")
    assert group.linear_bits == group.head_bits == group.embedding_bits == 4.5
    ft = weight_format("mlc-q4f16_ft")
    assert ft.linear_bits == 4 + 16 / 4096 and ft.head_bits == ft.embedding_bits == 4.5


def test_no_quantized_format_falls_in_the_16_bit_family():
    # a name's marks choose the family whose kernels run it: MLC's q4f16_1 names its fp16 math, not its storage
    for fmt in WEIGHT_FORMATS:
        family = format_family(fmt.name)
        assert (family == "16-bit") == (fmt.linear_bits >= 16), (fmt.name, family)
    for name in ("exl2-4.65bpw", "mlx-q4-g32"):
        assert format_family(weight_format(name).name) in ("exllama", "mlx")


def test_existing_formats_keep_their_bits_by_part():
    assert weight_format("mxfp4-experts").dense_bits == 16 and weight_format("mxfp4-experts").expert_bits == 4.25
    assert weight_format("int4-awq").dense_bits == weight_format("int4-awq").expert_bits == 4 + 16 / 128 + 4 / 128


@pytest.mark.parametrize("name", ["exl2-99bpw", "0bpw", "mlx-q7", "hqq-9bit", "q3_k_xl"])
def test_impossible_or_unknown_names_are_refused(name):
    with pytest.raises(UnknownNameError):
        weight_format(name)


def test_unknown_name_lists_the_parametric_patterns():
    with pytest.raises(UnknownNameError, match=r"Parametric names: exl2-4.65bpw.*mlx-q4.*hqq-4bit"):
        weight_format("exl9-4bpw")


def test_an_mlx_estimate_counts_4_5_bits_per_weight():
    from estimator.evaluation.api import estimate
    from estimator.physics.params import count_params
    from estimator.specs.database import load_database

    spec = load_database().models.get("llama-2-7b")
    p = count_params(spec)
    weights = estimate(spec, "Apple M2 Ultra (76-core GPU)", weight_format="mlx-q4", calibration=None)
    expected = (p.total - p.norms) * 4.5 / 8 + p.norms * 2
    assert weights.memory_weights_bytes == pytest.approx(expected, rel=1e-9)


# ggml-org's gpt-oss GGUFs (llama.cpp's MXFP4_MOE file type: experts MXFP4, every other tensor Q8_0) against
# a GGUF of the same checkpoint that keeps the non-expert tensors 16-bit; sizes as llama-bench printed them and
# tg128 on a Ryzen AI Max+ 395 (ROCm), docs/formulas.md §1.
GIB = 2**30
PUBLISHED_FILE_GIB = {("gpt-oss-20b", "MXFP4_MOE"): 11.27, ("gpt-oss-120b", "MXFP4_MOE"): 59.02,
                      ("gpt-oss-20b", "mxfp4-experts"): 12.83, ("gpt-oss-120b", "mxfp4-experts"): 60.87}


def test_mxfp4_moe_keeps_non_expert_tensors_at_q8_0():
    fmt = weight_format("mxfp4-moe")
    assert fmt.name == "MXFP4_MOE"
    assert fmt.expert_bits == 4.25 and fmt.dense_bits == fmt.head_bits == fmt.embedding_bits == 8.5


@pytest.mark.parametrize("model, fmt", sorted(PUBLISHED_FILE_GIB))
def test_gpt_oss_gguf_weights_match_the_published_file_sizes(model, fmt):
    from estimator import estimate

    weights = estimate(model, "h200", weight_format=fmt).memory_weights_bytes / GIB
    # the files also hold f32 norms, biases and attention sinks (about 0.03-0.2 GiB)
    assert weights == pytest.approx(PUBLISHED_FILE_GIB[model, fmt], rel=0.01)


def test_q8_0_non_expert_tensors_speed_up_decode_as_measured():
    """tg128 of gpt-oss-120b with llama.cpp ROCm: 41.52 tok/s for the MXFP4_MOE file, 29.72 for the one whose
    attention, head and embedding are 16-bit; decode reads 1.4x fewer bytes per token and runs 1.40x faster."""
    from estimator import estimate

    speed = {fmt: estimate("gpt-oss-120b", "AMD Ryzen AI Max+ 395", weight_format=fmt, engine="llama.cpp@rocm",
                           prompt_tokens=1, output_tokens=128).decode_tps_per_seq
             for fmt in ("MXFP4_MOE", "mxfp4-experts")}
    assert speed["MXFP4_MOE"] / speed["mxfp4-experts"] == pytest.approx(41.52 / 29.72, rel=0.10)
