"""MoE tile padding that follows the pass (llama.cpp's MMQ on CUDA picks one tile width for a layer's experts against
the pass's tokens), and the MoE batches of synthetic token ids that are judged but not fitted (docs/formulas.md §9)."""

from __future__ import annotations

import pytest

from estimator import estimate
from estimator.efficiency.engine_profiles import engine
from estimator.physics.expert_tiles import pass_tile_padding, pass_tile_width
from estimator.validation.fitting import synthetic_routing
from estimator.validation.predict import resolve_rows

GPT_OSS_20B = "openai/gpt-oss-20b"   # 24 MoE layers of 32 experts, 4 a token


def test_the_tile_width_follows_the_pass_and_the_granularity():
    """mmq_x steps of 8 below 48 and of 16 from 48 on, capped at the widest tile."""
    assert [float(pass_tile_width(t, 128)) for t in (2, 8, 9, 40, 41, 48, 49, 120, 121, 4096)] == \
        [8, 8, 16, 40, 48, 48, 64, 128, 128, 128]
    assert float(pass_tile_width(100, 64)) == 64


def test_each_touched_expert_computes_whole_tiles():
    """A 512-token micro-batch of gpt-oss-20b gives each of its 32 experts 64 tokens: one 128-wide tile pads 64; 320
    tokens over 8 experts (160 each) take two tiles (256) and pad 96; an engine without the rule pads nothing."""
    assert float(pass_tile_padding(512, 4, 32, 128)) == pytest.approx(64.0)
    assert float(pass_tile_padding(320, 4, 8, 128)) == pytest.approx(96.0)
    assert float(pass_tile_padding(512, 4, 32, 0)) == 0.0


def _without_the_rule(name: str):
    profile = engine(name)
    return profile.model_copy(update={"parameters": profile.parameters.model_copy(
        update={"expert_tile_max_tokens": 0})})


def test_a_decode_step_pays_the_tile_padding_by_hand():
    """gpt-oss-20b MXFP4 decoding B sequences on a DGX Spark under llama.cpp: B tokens touch
    32 (1 − 0.875^B) experts (32 of them, 4 a token) of 24 layers, each padded from M_e = 4B / touched tokens to a
    B-wide tile: at B = 16, 28.222 experts of 2.268 tokens pad 13.73 each; at B = 32, 31.554 experts of 4.057
    tokens pad 27.94. The extra compute time the rule adds is their FLOPs at one linear rate, so the two steps'
    extras stand as 31.554 × 27.94 to 28.222 × 13.73 = 2.275."""
    extra = []
    for batch in (16, 32):
        runs = [estimate(GPT_OSS_20B, "DGX Spark", weight_format="MXFP4_MOE", engine=profile, batch=batch,
                         prompt_tokens=512, output_tokens=32)
                for profile in ("llama.cpp", _without_the_rule("llama.cpp"))]
        extra.append(float(runs[0].decode_compute_s) - float(runs[1].decode_compute_s))
    assert extra[0] > 0 and extra[1] / extra[0] == pytest.approx(881.72 / 387.56, rel=1e-3)


@pytest.mark.parametrize("batch, measured", [(8, 254.1), (16, 400.9), (32, 614.8)])
def test_published_dgx_spark_moe_batches(batch, measured):
    """llama-batched-bench on a DGX Spark (build b6918, 512-token prompts, 32 generated): gpt-oss-20b's summed
    decode at 8, 16 and 32 sequences. A constant 40-token padding per touched expert put them 15-30% slow; the
    padding that follows the pass's width leaves them within 15% (in sample: the shipped profile)."""
    result = estimate(GPT_OSS_20B, "DGX Spark", weight_format="MXFP4_MOE", engine="llama.cpp", batch=batch,
                      prompt_tokens=512, output_tokens=32)
    assert float(result.decode_tps_total) == pytest.approx(measured, rel=0.15)


def _resolved(db, **cells):
    row = {"id": "x", "hardware": "DGX Spark", "n_gpus": "1", "model": GPT_OSS_20B, "weight_format": "MXFP4_MOE",
           "engine": "llama.cpp", "backend": "cuda", "batch": "8", "input_len": "512", "output_len": "32",
           "metric": "decode_tps_total", "token_ids": "random", **cells}
    resolved, out = resolve_rows([row], db)
    assert out[0]["status"] == "ok", out[0]["reason"]
    return row, resolved.configs[0], resolved.engines[0]


@pytest.mark.parametrize("cells, judged", [
    ({}, True),                                                            # CUDA's MMQ reads each touched expert once
    ({"batch": "1"}, False),                                               # one sequence routes as text does
    ({"token_ids": ""}, False),                                            # text
    ({"model": "Qwen/Qwen2.5-Coder-7B", "weight_format": "Q8_0"}, False),  # dense: no routing
    ({"backend": "metal", "hardware": "Apple M2 Ultra"}, False),  # one read a pair
    ({"backend": "metal", "hardware": "Apple M2 Ultra", "batch": "32"}, True),
])
def test_moe_batches_of_synthetic_token_ids_are_judged_where_their_bytes_follow_the_routing(db, cells, judged):
    """Random (or repeated) token ids route unlike text, so a MoE batch of them is judged but not fitted where the
    kernel reads each touched expert once (CUDA from two tokens); Metal's mul_mv_id reads every (token, expert)
    pair below 32 tokens, so there the routing does not change the bytes and the row is fitted."""
    assert synthetic_routing(*_resolved(db, **cells)) is judged


def test_the_dataset_refuses_an_unknown_token_ids_cell():
    from estimator.validation.dataset import _row_problem
    row = {"id": "x", "url": "https://example.org/a", "metric": "decode_tps_total", "source": "s", "date": "",
           "engine": "llama.cpp"}
    assert _row_problem({**row, "token_ids": "random"}, set()) is None
    assert "token_ids 'zeros' is not one of repeated, random" in _row_problem({**row, "token_ids": "zeros"}, set())
