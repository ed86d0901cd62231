"""Skewed expert routing: distinct experts read, the busiest expert-parallel rank, and the estimate."""

from __future__ import annotations

import numpy as np
import pytest

from estimator import estimate
from estimator.errors import ConfigurationError
from estimator.physics.expert_skew import busiest_rank, distinct_experts, inclusion_probabilities
from estimator.physics.traffic import expected_experts
from tests.helpers import cli


@pytest.mark.parametrize("E, k, tokens", [(8, 2, 1), (8, 2, 16), (128, 8, 64), (256, 8, 3)])
def test_no_skew_is_uniform_routing(E, k, tokens):
    assert float(distinct_experts(E, k, tokens, 0.0)) == pytest.approx(float(expected_experts(E, k, tokens)))
    assert float(busiest_rank(E, k, tokens, 0.0, 4)[0]) == pytest.approx(0.25)


def test_a_skewed_router_by_hand():
    # E = 4, k = 1, s = 1: p = (1, 1/2, 1/3, 1/4) / (25/12) = (0.48, 0.24, 0.16, 0.12)
    assert inclusion_probabilities(4, 1, 1.0) == pytest.approx([0.48, 0.24, 0.16, 0.12])
    # two tokens: sum of 1 - (1 - p)^2 = 0.7296 + 0.4224 + 0.2944 + 0.2256
    assert float(distinct_experts(4, 1, 2, 1.0)) == pytest.approx(1.672)
    # two ranks dealt by popularity: rank 0 holds experts 1 and 3
    share, touched = busiest_rank(4, 1, 2, 1.0, 2)
    assert float(share) == pytest.approx(0.64) and float(touched) == pytest.approx(0.7296 + 0.2944)


def test_top_k_never_picks_an_expert_twice():
    pi = inclusion_probabilities(8, 4, 5.0)
    assert pi.max() <= 1.0 and pi.sum() == pytest.approx(4.0)


def test_a_dense_row_beside_moe_rows_has_no_experts_under_skew():
    # one vectorized batch: a dense model (E = k = 0) and an MoE; the dense row must stay 0, never 0/0
    with np.errstate(all="raise"):
        touched = distinct_experts(np.array([0, 4]), np.array([0, 1]), 2, np.array([1.0, 1.0]))
        share, on_rank = busiest_rank(np.array([0, 4]), np.array([0, 1]), 2, 1.0, 2)
    assert touched == pytest.approx([0.0, 1.672])
    assert share == pytest.approx([0.0, 0.64]) and on_rank == pytest.approx([0.0, 0.7296 + 0.2944])


@pytest.mark.parametrize("batch", [1, 4, 32, 256])
def test_on_one_device_more_skew_never_reads_more(batch, db):
    read = [estimate("mixtral-8x7b", "h200", batch=batch, expert_skew=s).decode_bytes_weights
            for s in (0.0, 0.5, 1.0, 2.0)]
    assert np.all(np.diff(read) <= 1e-6 * read[0]), read


@pytest.mark.parametrize("model, experts, k, gpus", [("mixtral-8x7b", 8, 2, 2), ("qwen3-30b-a3b", 128, 8, 4)])
def test_under_expert_parallelism_more_skew_never_speeds_a_compute_bound_pass(model, experts, k, gpus, db):
    """A long prefill is compute-bound: the busiest rank's token share sets it.

    While no expert is picked by every token (k p_1 < 1). Beyond, the top experts saturate and
    spread evenly over the ranks: in the limit every token picks the same k experts, which the
    popularity-order placement balances.
    """
    skews = [s for s in np.linspace(0, 2, 9) if inclusion_probabilities(experts, k, s).max() < 1]
    assert len(skews) >= 3
    ttft = [estimate(model, "h100", n_gpus=gpus, ep=gpus, prompt_tokens=8192, weight_format="fp8",
                     expert_skew=s).ttft_s for s in skews]
    assert np.all(np.diff(ttft) >= 0) and ttft[-1] > 1.01 * ttft[0], ttft
    shares = [float(busiest_rank(experts, k, 4096, s, gpus)[0]) for s in skews]
    assert np.all(np.diff(shares) > 0)


def test_skew_without_expert_parallelism_does_not_unbalance(db):
    """Tensor parallelism splits every expert over all ranks: skew only removes reads."""
    plain = estimate("mixtral-8x7b", "h100", n_gpus=2, prompt_tokens=8192, weight_format="fp8")
    skewed = estimate("mixtral-8x7b", "h100", n_gpus=2, prompt_tokens=8192, weight_format="fp8", expert_skew=1.5)
    assert skewed.ttft_s <= plain.ttft_s


def test_bad_skews_are_refused(capsys):
    code, _, err = cli(capsys, "estimate", "--model", "mixtral-8x7b", "--gpu", "h100", "--expert-skew", "-1")
    assert code == 2 and "--expert-skew" in err and "from 0 to 10" in err and "Traceback" not in err
    with pytest.raises(ConfigurationError, match="dense models"):
        estimate("llama-3.1-8b", "h100", expert_skew=1.0)
    with pytest.raises(ConfigurationError, match="not modelled"):
        estimate("qwen3-30b-a3b", "rtx 4090", weight_format="Q4_K_M", cpu_moe="all", expert_skew=1.0)


def test_each_touched_expert_costs_a_tile_of_tokens(db):
    """MoE grouped GEMMs: every expert a pass touches adds the FLOPs of M_tile tokens (docs/formulas.md §9)."""
    from estimator.efficiency.defaults import GENERIC_ENGINE
    from estimator.physics.roofline import COMPUTE
    from estimator.physics.traffic import expected_experts as touched
    from tests.helpers import run

    spec, hw = db.models.get("mixtral-8x7b"), db.hardware.get("h100")
    plain = GENERIC_ENGINE.model_copy(update={"per_step_s": 0.0, "per_layer_s": 0.0})
    tiled = plain.model_copy(update={"expert_tile_tokens": 64.0})
    a, b = (run(spec, hw, fmt="bf16", T=4096, ideal=False, engine=e) for e in (plain, tiled))
    shape = spec.shape
    per_expert = 3 * shape.hidden_size * shape.moe.expert_intermediate_size      # gate, up, down
    padding = 2 * per_expert * (shape.num_layers - shape.moe.num_dense_layers) * float(touched(8, 2, 4096)) * 64
    assert a["prefill_bound"] == b["prefill_bound"] == COMPUTE
    rate = (a["prefill_flops_linear"] + a["prefill_flops_head"]) / a["prefill_linear_s"]
    assert b["prefill_linear_s"] - a["prefill_linear_s"] == pytest.approx(padding / rate, rel=1e-3)
    dense = db.models.get("llama-3.1-8b")
    assert run(dense, hw, fmt="bf16", ideal=False, engine=tiled)["ttft_s"] == \
        run(dense, hw, fmt="bf16", ideal=False, engine=plain)["ttft_s"]


def test_a_one_token_pass_runs_its_experts_as_matrix_vector_products(db):
    """llama.cpp's MUL_MAT_ID runs each routed expert as a mat-vec for one token on every backend (ggml-cuda and
    ggml-vulkan take their mul_mat_vec paths at one token), which pads no tile: Mixtral's batch-1 decode on an H100
    costs what it costs without tiles, however large the tile, and a batch of two pays the tile for each expert it
    touches (docs/formulas.md §9). A tile of 1,024 tokens makes the padding 31 ms, so it cannot hide under the
    weight stream."""
    from estimator.efficiency.defaults import GENERIC_ENGINE
    from estimator.physics.roofline import COMPUTE, MEMORY
    from estimator.physics.traffic import expected_experts as touched
    from tests.helpers import run

    spec, hw = db.models.get("mixtral-8x7b"), db.hardware.get("h100")
    plain = GENERIC_ENGINE.model_copy(update={"per_step_s": 0.0, "per_layer_s": 0.0})
    tiled = plain.model_copy(update={"expert_tile_tokens": 1024.0})
    matvec = tiled.model_copy(update={"expert_matvec_tokens": 1})
    one = [run(spec, hw, fmt="bf16", B=1, ideal=False, engine=e) for e in (plain, tiled, matvec)]
    assert one[2]["decode_linear_s"] == one[0]["decode_linear_s"] and one[2]["decode_bound"] == MEMORY
    assert one[1]["decode_bound"] == COMPUTE
    two = [run(spec, hw, fmt="bf16", B=2, ideal=False, engine=e) for e in (plain, tiled, matvec)]
    assert two[2]["decode_linear_s"] == two[1]["decode_linear_s"] and two[2]["decode_bound"] == COMPUTE
    # both tiled passes are compute-bound at one rate: their times are in the ratio of their FLOPs, each token's and
    # a tile for each expert touched (2 of 8 at one token, 8 (1 - (3/4)²) = 3.5 at two)
    per_expert = 3 * spec.shape.hidden_size * spec.shape.moe.expert_intermediate_size
    flops = lambda r, tokens: (r["decode_flops_linear"] + r["decode_flops_head"]  # noqa: E731
                               + 2 * per_expert * spec.shape.num_layers * float(touched(8, 2, tokens)) * 1024)
    assert two[1]["decode_linear_s"] / one[1]["decode_linear_s"] == pytest.approx(
        flops(two[1], 2) / flops(one[1], 1), rel=1e-9)


def test_an_engine_that_prefills_in_micro_batches_pads_its_experts_once_per_micro_batch(db):
    """llama.cpp runs a prompt in micro-batches of n_ubatch (512) tokens: a 4,096-token prefill of Mixtral touches
    its experts 8 times, each with 512 tokens, so the tile padding is 8 x that of 512 tokens, not that of one pass
    of 4,096 (docs/formulas.md §9)."""
    from estimator.efficiency.defaults import GENERIC_ENGINE
    from estimator.physics.traffic import expected_experts as touched
    from tests.helpers import run

    spec, hw = db.models.get("mixtral-8x7b"), db.hardware.get("h100")
    plain = GENERIC_ENGINE.model_copy(update={"per_step_s": 0.0, "per_layer_s": 0.0})
    one_pass = plain.model_copy(update={"expert_tile_tokens": 64.0})
    chunked = one_pass.model_copy(update={"prefill_in_ubatches": True})
    a, b, c = (run(spec, hw, fmt="bf16", T=4096, ideal=False, engine=e) for e in (plain, one_pass, chunked))
    rate = (a["prefill_flops_linear"] + a["prefill_flops_head"]) / a["prefill_linear_s"]
    per_expert = 3 * spec.shape.hidden_size * spec.shape.moe.expert_intermediate_size
    padding = lambda experts: 2 * per_expert * spec.shape.num_layers * experts * 64 / rate  # noqa: E731
    assert b["prefill_linear_s"] - a["prefill_linear_s"] == pytest.approx(padding(float(touched(8, 2, 4096))),
                                                                          rel=1e-3)
    assert c["prefill_linear_s"] - a["prefill_linear_s"] == pytest.approx(padding(8 * float(touched(8, 2, 512))),
                                                                          rel=1e-3)
