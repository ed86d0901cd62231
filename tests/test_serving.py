"""Continuous batching under load: Little's law, queueing, saturation and chunked prefill."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.evaluation.api import estimate
from estimator.serving.continuous_batching import _ttft, steady_state

COMMON = dict(prompt_tokens=1024, output_tokens=256)


def test_steady_state_on_a_hand_worked_toy():
    # ITL(N) = 10 ms + 0.1 ms per sequence, prefill 20 ms, 101 output tokens, 1 request/s
    itl = lambda n: 0.010 + 0.0001 * n  # noqa: E731
    state = steady_state(itl, np.array(0.020), np.array(1000.0), 101, 0.0, 1.0, np.array(1e6))
    n = float(state["steady_batch"])
    # N = X (O-1) t_step with t_step = ITL(N) / (1 - X t_pf): N = 100 (0.01 + 1e-4 N) / 0.98
    assert n == pytest.approx(100 * 0.010 / 0.98 / (1 - 100 * 0.0001 / 0.98), rel=1e-6)
    u = 0.020
    expected_ttft = 0.020 + u * 0.020 / (2 * (1 - u)) + float(state["itl_s"]) / 2
    assert float(state["ttft_s"]) == pytest.approx(expected_ttft, rel=1e-6)


def test_littles_law_closed_loop(db):
    e = estimate("llama-3.1-8b", "h100", concurrency=48, **COMMON)
    assert e.request_rate * e.e2e_latency_s == pytest.approx(48, rel=0.02)
    assert e.steady_batch == pytest.approx(e.request_rate * 255 * e.itl_s, rel=0.02)
    assert e.throughput_out_tps == pytest.approx(e.request_rate * 256)


def test_queueing_grows_with_the_rate_until_saturation(db):
    low = estimate("llama-3.1-8b", "h100", rate=1, **COMMON)
    high = estimate("llama-3.1-8b", "h100", rate=0.8 * low.max_rate, **COMMON)
    over = estimate("llama-3.1-8b", "h100", rate=1.5 * low.max_rate, **COMMON)
    assert low.ttft_s >= low.ttft_prefill_s and high.ttft_s > low.ttft_s
    assert high.itl_s > low.itl_s and not high.saturated
    assert over.saturated and over.to_dict()["ttft_s"] is None and "saturated" in over.warnings[0]


@pytest.mark.parametrize("model, gpu", [("llama-3.1-8b", "h100"), ("mixtral-8x7b", "h200"),
                                        ("qwen2.5-7b", "rtx 4090")])
def test_more_concurrency_never_lowers_throughput_while_memory_bound(model, gpu):
    last = 0.0
    for c in (1, 2, 4, 8, 16, 32):
        e = estimate(model, gpu, concurrency=c, weight_format="fp8" if gpu != "rtx 4090" else "Q4_K_M", **COMMON)
        assert e.decode_bound in ("memory", "overhead")
        assert e.throughput_out_tps >= last * (1 - 1e-9)
        last = e.throughput_out_tps


def test_chunked_prefill_trades_ttft_for_smoother_decode(db):
    whole = estimate("llama-3.1-8b", "h100", rate=1.5, prompt_tokens=8192, output_tokens=256)
    chunked = estimate("llama-3.1-8b", "h100", rate=1.5, prompt_tokens=8192, output_tokens=256, chunked_prefill=2048)
    assert chunked.itl_s < whole.itl_s
    assert chunked.ttft_s > whole.ttft_prefill_s


def test_chunked_ttft_counts_whole_chunks():
    t = _ttft(np.array(0.1), np.array(1000.0), np.array(300.0), np.array(0.02), np.array(0.01), np.array(0.0))
    assert float(t) == pytest.approx(4 * 0.02 + 0.005)


@pytest.mark.parametrize("load", [{"concurrency": 32}, {"rate": 2.0}, {"rate": 2.0, "chunked_prefill": 2048}])
def test_a_sweep_under_load_is_finite_wherever_it_can_run(load):
    from estimator.evaluation.api import sweep
    from estimator.serving.workload import ServingOptions
    t = sweep(["llama-3.1-8b", "mixtral-8x7b", "deepseek-ai/DeepSeek-V3", "openai/gpt-oss-120b"],
              ["h100", "rtx 4090", "m2 ultra", "mi300x"], ["fp8", "Q4_K_M"], ["f16"], [1], [2048], [256], [1, 8],
              serving=ServingOptions(**load))
    runnable = t.columns["fits"] & ~t.columns["saturated"]
    assert runnable.any() and (~runnable).any()
    for key in ("ttft_s", "itl_s", "decode_tps_per_seq", "throughput_out_tps", "steady_batch"):
        assert np.all(np.isfinite(t.columns[key][runnable])), key
