"""GEMMs at the FP4 tensor rate reach their own share of it (EngineDefaults.fp4_compute_scale).

The engine's FP4 GEMMs (NVFP4, MXFP4 on a device with FP4 tensor cores) run at fp4_compute_scale times the
share of their peak its other GEMMs reach (docs/formulas.md §9); a format that falls back to FP8 or BF16, and
attention, keep the engine's compute share.
"""

from __future__ import annotations

import pytest

from estimator.efficiency.engine_profiles import engine
from estimator.physics.roofline import COMPUTE
from estimator.validation.dataset import load_dataset
from estimator.validation.fitting import LOWER, PARAMETER_NAMES, UPPER
from tests.helpers import median_abs_error, run

NO_OVERHEADS = {"per_step_s": 0.0, "per_layer_s": 0.0, "per_sequence_s": 0.0}


def _prefill(db, gpu, fmt, scale):
    spec, hw = db.models.get("llama-3.1-8b"), db.hardware.get(gpu)
    trt = engine("tensorrt-llm").parameters.model_copy(update={**NO_OVERHEADS, "fp4_compute_scale": scale})
    return run(spec, hw, fmt=fmt, B=1, T=8192, O=2, ideal=False, engine=trt)


def test_fp4_gemms_take_their_own_share_of_the_fp4_peak(db):
    # Llama-3.1-8B, 8,192-token prompt, NVFP4 on a B200: the linear layers are compute-bound at either share,
    # so halving the FP4 share doubles their time and leaves attention (BF16/FP8 kernels) alone
    full, half = _prefill(db, "b200", "nvfp4", 1.0), _prefill(db, "b200", "nvfp4", 0.5)
    assert full["prefill_bound"] == half["prefill_bound"] == COMPUTE
    assert half["prefill_linear_s"] == pytest.approx(2 * full["prefill_linear_s"], rel=1e-9)
    assert half["prefill_attention_s"] == pytest.approx(full["prefill_attention_s"], rel=1e-12)


@pytest.mark.parametrize("gpu, fmt", [("b200", "fp8"), ("h100", "nvfp4")])
def test_gemms_not_at_the_fp4_rate_keep_the_engine_share(db, gpu, fmt):
    # FP8 on a B200, and NVFP4 on an H100 (no FP4 tensor cores: it computes in FP8) are not FP4 GEMMs
    assert _prefill(db, gpu, fmt, 0.5)["prefill_linear_s"] == pytest.approx(
        _prefill(db, gpu, fmt, 1.0)["prefill_linear_s"], rel=1e-12)


def test_the_fitted_share_is_inside_its_bounds():
    # TensorRT-LLM is the engine with FP4 rows (B200, GB200, RTX PRO 6000 Blackwell): its share is fitted
    i = PARAMETER_NAMES.index("fp4_compute_scale")
    fitted = engine("tensorrt-llm").parameters.fp4_compute_scale
    assert LOWER[i] * 1.01 < fitted < UPPER[i] * 0.99


def test_published_blackwell_fp4_throughput(db):
    # TensorRT-LLM's published max-throughput tables on B200 and GB200 in NVFP4/MXFP4 (180 rows, three
    # releases): with the shipped profile, fitted on them among others (a regression guard, not the held-out
    # figure, which docs/formulas.md §9 gives), the median error is 14%
    rows = [r for r in load_dataset().usable() if r["hardware"] in ("NVIDIA B200", "NVIDIA GB200")
            and r["engine"] == "TensorRT-LLM" and "fp4" in r["weight_format"].lower()
            and r["metric"].startswith("throughput")]
    assert len(rows) >= 150
    assert median_abs_error(rows, db) <= 0.18


@pytest.mark.parametrize("gpu, engine_name, dtype", [
    ("b200", "tensorrt-llm", "mxfp8"), ("gb200", "vllm", "mxfp8"),   # Blackwell: MXFP8 activations x MXFP4 experts
    ("h100", "tensorrt-llm", "bf16"), ("h200", "sglang", "bf16"),    # Hopper: FP8 MMA takes no block scales: BF16
    ("mi300x", "vllm", "bf16"),                                      # CDNA3: FP8 but no FP4, so no MX operands
    ("b200", "llama.cpp", "bf16"),                                   # an engine with no FP8 path: its 16-bit GEMMs
])
def test_gpt_oss_experts_compute_as_they_are_served(db, gpu, engine_name, dtype):
    """gpt-oss's MXFP4 experts are served with MXFP8 activations on Blackwell and BF16 ones on Hopper (TensorRT-LLM's
    gpt-oss deployment guide), so on a B200 they compute at its FP8 rate (4.5 PFLOPS dense), not its FP4 one (9),
    and they are not FP4 GEMMs (the engine's FP4 share does not apply)."""
    from estimator.evaluation.api import estimate
    e = estimate("gpt-oss-120b", gpu, weight_format="mxfp4-experts", engine=engine_name)
    assert e.to_dict()["compute_dtype"] == dtype


def test_the_mxfp8_rate_is_the_fp8_rate_where_the_tensor_cores_take_fp4(db):
    b200, h100, mi300x = (db.hardware.get(name) for name in ("b200", "h100", "mi300x"))
    assert b200.peak_flops_per_s("mxfp8") == b200.peak_flops_per_s("fp8") == pytest.approx(4.5e15)
    assert h100.peak_flops_per_s("fp8") and h100.peak_flops_per_s("mxfp8") is None
    assert mi300x.peak_flops_per_s("fp8") and mi300x.peak_flops_per_s("mxfp8") is None
