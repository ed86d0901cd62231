"""A 16-bit weight stream bounded per SM: by Little's law a kernel that keeps a bounded number of bytes in flight on
each streaming multiprocessor reads at most a fixed rate per SM, so an HBM part with many bytes a second per SM
gets a smaller share of its datasheet than a GDDR card (llama.cpp's CUDA mat-vecs; docs/formulas.md §9)."""

from __future__ import annotations

import numpy as np
import pytest

from estimator import estimate
from estimator.efficiency.engine_profiles import engine
from estimator.efficiency.rates import PER_SM_CORNER, per_sm_bounded
from tests.helpers import cli


def test_a_stream_above_the_per_sm_bound_reads_at_the_bound_with_its_corner_rounded():
    """108 SMs at 10 GB/s each bound a 1.5 TB/s stream to 1.08 TB/s, less the rounded corner:
    1.08 × (1 + (1.08 / 1.5)^8)^(−1/8) = 1.0706 TB/s (p = 8)."""
    assert PER_SM_CORNER == 8
    assert float(per_sm_bounded(1.5e12, 108, 1e10)) == pytest.approx(1.0706e12, rel=1e-4)


def test_a_stream_well_below_the_bound_keeps_its_rate():
    # 1.6x below the bound: (1 + 1.6^-8)^(-1/8) = 0.9971 of the stream's own rate
    assert float(per_sm_bounded(1e12, 160, 1e10)) == pytest.approx(0.9971e12, rel=1e-4)


def test_no_bound_without_an_engine_rate_or_a_recorded_sm_count():
    assert per_sm_bounded(1.5e12, 108, None) == 1.5e12
    assert float(per_sm_bounded(1.5e12, np.nan, 1e10)) == 1.5e12


def test_only_llamacpp_on_cuda_is_bounded_per_sm():
    assert engine("llama.cpp").parameters.native_bytes_per_s_per_sm is not None
    for name in ("llama.cpp@rocm", "llama.cpp@metal", "llama.cpp@vulkan", "vLLM", "SGLang", "TensorRT-LLM", "MLX"):
        assert engine(name).parameters.native_bytes_per_s_per_sm is None, name


@pytest.mark.parametrize("gpu, measured", [("A100 SXM4 80GB", 53.49), ("A100 PCIe 80GB", 54.84),
                                           ("H100 PCIe", 68.03)])
def test_published_hbm_f16_decode(gpu, measured):
    """XiongjieDai's tg512 with Llama-3-8B F16 (2024 builds): 53.49, 54.84 and 68.03 tokens/s, 7.5-9.0 GB/s an
    SM, where the HBM group's share of the datasheet alone predicted 1.3-1.7x too fast."""
    result = estimate("meta-llama/Meta-Llama-3-8B", gpu, weight_format="F16", engine="llama.cpp", prompt_tokens=1,
                      output_tokens=512, attention="unfused")
    assert float(result.decode_tps_per_seq) == pytest.approx(measured, rel=0.25)


@pytest.mark.parametrize("gpu, fmt, within", [("A100 SXM4 80GB", "Q4_K_M", 1e-9), ("RTX 4090", "F16", 0.01)])
def test_the_bound_leaves_quantized_weights_and_gddr_cards_alone(gpu, fmt, within):
    """Dequantizing kernels are not bounded per SM (the same estimate with the bound lifted), and a GDDR card's
    16-bit stream stays well under its bound (an RTX 4090's 128 SMs allow 1.3 TB/s: within 1%)."""
    profile = engine("llama.cpp")
    unbounded = profile.model_copy(update={"parameters": profile.parameters.model_copy(
        update={"native_bytes_per_s_per_sm": None})})
    bounded, free = (estimate("meta-llama/Meta-Llama-3-8B", gpu, weight_format=fmt, engine=p, prompt_tokens=1,
                              output_tokens=512) for p in (profile, unbounded))
    assert float(bounded.decode_tps_per_seq) == pytest.approx(float(free.decode_tps_per_seq), rel=within)


def test_the_bound_line_names_the_sms_where_they_bind(capsys):
    """An A100's 108 SMs hold llama.cpp's F16 decode below its datasheet share, and the estimate says so; an RTX
    4090's do not, and it says nothing of them."""
    args = ("estimate", "--model", "meta-llama/Meta-Llama-3-8B", "--engine", "llama.cpp", "--format", "F16",
            "--prompt", "1", "--output", "512")
    code, out, _ = cli(capsys, *args, "--gpu", "A100 SXM4 80GB")
    assert code == 0 and "108 SMs at" in out and "keep few bytes in flight per SM" in out
    code, out, _ = cli(capsys, *args, "--gpu", "RTX 4090")
    assert code == 0 and "SMs at" not in out


def test_show_gpu_derives_the_fp32_lanes_per_sm(capsys):
    """`roofline show gpu` checks an entry's SM count and clock against its FP32 peak, as it does its bus width and
    data rate against its bandwidth: an RTX 4090's 82.6 TFLOPS over 128 SMs at 2,520 MHz is 128 lanes an SM."""
    code, out, _ = cli(capsys, "show", "gpu", "RTX 4090")
    line = next(x for x in out.splitlines() if "FP32 lanes per SM" in x)
    assert code == 0 and float(line.split()[4]) == pytest.approx(128, rel=0.01)
