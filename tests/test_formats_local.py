"""Formats of local runtimes: EXL2/EXL3, any <N>bpw, MLX, bitsandbytes, HQQ; bits per weight against
each format's definition (docs/formulas.md §1: scales and zero points included)."""

from __future__ import annotations

import pytest

from estimator.errors import UnknownNameError
from estimator.specs.formats import WEIGHT_FORMATS, weight_format


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
