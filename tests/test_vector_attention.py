"""MLX's decode attention is a vector kernel (EngineDefaults.vector_decode_attention, docs/formulas.md §13).

mx.fast.scaled_dot_product_attention runs a decode pass (up to 8 new tokens a sequence) as sdpa_vector: one
simdgroup per query head walks the keys on the FP32 lanes, so its time grows with the query heads, not with the
cache bytes, and a model with many query heads per KV head is bound by that kernel, not by its KV reads.
"""

from __future__ import annotations

import numpy as np
import pytest

from estimator import estimate
from estimator.efficiency.engine_profiles import engine
from estimator.evaluation.columns import model_columns
from estimator.specs.config_json import spec_from_config
from estimator.validation.fitting import LOWER, PARAMETER_NAMES, UPPER

M3_ULTRA = "apple m3 ultra (80-core gpu)"
M5_MAX = "apple m5 max (40-core gpu)"
LONG = dict(weight_format="mlx-q4", prompt_tokens=65536, output_tokens=100)


def _mlx(vector: bool):
    mlx = engine("mlx")
    return mlx.model_copy(update={"parameters": mlx.parameters.model_copy(update={"vector_decode_attention": vector})})


def _decode(model, gpu, vector=True, **args):
    return estimate(model, gpu, engine=_mlx(vector), **{**LONG, **args}).results


def test_a_many_headed_gqa_decode_is_bound_by_the_vector_kernel(db):
    """Llama-3.1-405B on an M3 Ultra, mean decode context 65,586: 128 query heads of 128 over 8 KV heads, 126
    layers. Attention does 4 x 128 x 128 x 126 x 65,586 = 541.6 GFLOP a step; on the FP32 lanes (28.27 TFLOPS)
    at MLX's share that takes longer than reading the 33.9 GB cache, so the kernel, not the memory, sets it."""
    share = engine("mlx").parameters.vector_attention_eff
    fp32 = db.hardware.get(M3_ULTRA).peak_flops_per_s("fp32")
    r = _decode("llama-3.1-405b", M3_ULTRA)
    flops = 4 * 128 * 128 * 126 * 65586
    assert r["decode_flops_attention"] == pytest.approx(flops, rel=1e-9)
    assert r["decode_attention_s"] == pytest.approx(flops / (fp32 * share), rel=1e-9)
    matrix = _decode("llama-3.1-405b", M3_ULTRA, vector=False)
    assert matrix["decode_attention_s"] < r["decode_attention_s"] / 1.5
    assert matrix["decode_bytes_kv_read"] == r["decode_bytes_kv_read"]


def test_a_four_to_one_gqa_decode_stays_on_its_kv_reads(db):
    """Llama-3.1-8B: 32 query heads over 8 KV heads do a quarter of the 405B's work per cache byte; its decode
    attention is the time of the KV reads whichever kernel runs it."""
    vector, matrix = _decode("llama-3.1-8b", M3_ULTRA), _decode("llama-3.1-8b", M3_ULTRA, vector=False)
    assert vector["decode_attention_s"] == pytest.approx(matrix["decode_attention_s"], rel=1e-12)


@pytest.mark.parametrize("model", ["gemma-2-9b", "deepseek-v3"])
def test_attention_by_hand_and_mla_do_not_run_the_vector_kernel(model):
    """Gemma 2's capped scores are attended by hand and an MLA latent (576 wide) has no sdpa_vector build: both
    keep the matrix path."""
    args = dict(weight_format="mlx-q4", prompt_tokens=8192, output_tokens=100)
    vector = estimate(model, M3_ULTRA, engine=_mlx(True), **args).results
    matrix = estimate(model, M3_ULTRA, engine=_mlx(False), **args).results
    assert vector["decode_attention_s"] == matrix["decode_attention_s"]


def test_the_kernels_conditions(db):
    """MLX takes sdpa_vector for at most 8 new tokens a sequence, at most 32 query rows per KV head, and head
    sizes 64, 96, 128 and 256 (ScaledDotProductAttention::use_fallback)."""
    m = model_columns([db.models.get(name) for name in ("llama-3.1-405b", "llama-3.1-8b", "deepseek-v3")])
    mlx = engine("mlx").parameters
    fused = np.ones(3, dtype=bool)
    assert mlx.vector_decode(m, fused, 1).tolist() == [True, True, False]
    assert mlx.vector_decode(m, fused, 2).tolist() == [True, True, False]    # 405B: 2 x 16 = 32 rows
    assert mlx.vector_decode(m, fused, 3).tolist() == [False, True, False]   # 48 rows: the unfused fallback
    assert mlx.vector_decode(m, fused, 8).tolist() == [False, True, False]
    assert mlx.vector_decode(m, fused, 9).tolist() == [False, False, False]
    assert not mlx.vector_decode(m, ~fused, 1).any()
    assert not engine("llama.cpp").parameters.vector_decode(m, fused, 1).any()


def _one_layer(kv_heads: int):
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1, "num_attention_heads": 32,
           "num_key_value_heads": kv_heads, "head_dim": 128, "intermediate_size": 14336, "vocab_size": 32000,
           "max_position_embeddings": 65536}
    return spec_from_config(cfg, f"one-layer-{kv_heads}kv", "https://example.org/config.json")


def test_published_kernel_timings_on_an_m5_max():
    """One sdpa_vector call of 32 query heads of 128 over 32,768 cached tokens, on an M5 Max (40-core GPU), timed
    in bf16 in ml-explore/mlx issue #3837 (a comment of 2026-08-05) for 1, 2, 4, 8 and 32 KV heads: 0.307, 0.326,
    0.351, 0.451 and 1.148 ms. The time is flat while the kernel binds and grows with the cache once the reads
    do. The fit never saw these timings: the share it took from M3-family decode rows predicts 0.205, 0.205,
    0.205, 0.308 and 1.233 ms, the kernel-bound calls 33-42% fast (the M5 Max reaches a lower share of its
    FP32 peak than the M3 chips the fit saw) and the read-bound 32-head call 7% slow. Without the vector kernel,
    one KV head would be predicted eight times too fast."""
    measured = {1: 0.307e-3, 2: 0.326e-3, 4: 0.351e-3, 8: 0.451e-3, 32: 1.148e-3}
    args = dict(weight_format="bf16", kv_format="bf16", prompt_tokens=32768, output_tokens=1)
    predicted = {n: estimate(_one_layer(n), M5_MAX, engine="mlx", **args).results["decode_attention_s"]
                 for n in measured}
    for n, t in measured.items():
        assert 1 / 1.8 < predicted[n] / t < 1.8, (n, predicted[n], t)
    assert predicted[1] == pytest.approx(predicted[4], rel=1e-9)          # the kernel binds: flat
    assert predicted[32] > 4 * predicted[1]                               # the reads bind
    assert predicted[32] == pytest.approx(measured[32], rel=0.10)
    matrix = estimate(_one_layer(1), M5_MAX, engine=_mlx(False), **args).results["decode_attention_s"]
    assert matrix < measured[1] / 5


def test_the_fitted_share_is_inside_its_bounds_and_identified():
    i = PARAMETER_NAMES.index("vector_attention")
    share = engine("mlx").parameters.vector_attention_eff
    assert LOWER[i] * 1.01 < share < UPPER[i] * 0.99
    record = engine("mlx").fit.parameters["vector_attention"]
    assert not record.on_bound and record.stderr is not None and record.stderr < share / 3
    assert "vector_attention" not in engine("llama.cpp").fit.parameters   # no such kernel, nothing fitted
