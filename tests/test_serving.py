"""Continuous batching under load: Little's law, queueing, saturation and chunked prefill."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from estimator.evaluation.api import estimate
from estimator.serving.continuous_batching import _service, _ttft, steady_state
from estimator.serving.mixed_steps import MixedSteps
from estimator.validation.predict import predict_rows

ROOT = Path(__file__).resolve().parents[1]

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


def test_prompts_that_queue_share_the_launch_of_a_prefill():
    """The toy above with a 20 ms prefill that launching from Python stretches to 80 ms: a prompt's own first token
    waits for the whole 80 ms, but the queue and the decode steps it stalls are charged the 20 ms on the devices,
    since waiting prompts are prefilled together (an engine that launched each alone would saturate at 10/s)."""
    itl = lambda n: 0.010 + 0.0001 * n  # noqa: E731
    plain = steady_state(itl, np.array(0.020), np.array(1000.0), 101, 0.0, 10.0, np.array(1e6))
    launched = steady_state(itl, np.array(0.080), np.array(1000.0), 101, 0.0, 10.0, np.array(1e6),
                            launch_excess_s=np.array(0.060))
    assert float(launched["ttft_s"]) == pytest.approx(float(plain["ttft_s"]) + 0.060, rel=1e-6)
    assert float(launched["itl_s"]) == pytest.approx(float(plain["itl_s"]), rel=1e-9)
    assert not launched["saturated"]
    alone = steady_state(itl, np.array(0.080), np.array(1000.0), 101, 0.0, 12.5, np.array(1e6))
    assert alone["saturated"]


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
    service = _service(np.array(0.1), np.array(1000.0), np.array(300.0), np.array(0.02))   # 4 chunks of 300
    t = _ttft(service, np.array(0.1), np.array(0.01), np.array(0.0))
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


def test_a_mixed_step_by_hand():
    """Prompts of 467 tokens arriving at 16/s ride in the decode steps: a prompt token costs 57 us (50 us of it
    linear layers), so the prompts take X P t_tok = 42.6% of the time. A 20-sequence decode step of 40 ms has
    10.77 ms of linear layers (affine from 10 ms at one sequence to 14 ms at 100); one prompt's 23.35 ms of
    linear layers outlast them, so they hide in every step that carries a prompt: with the step before at
    50 ms, a Poisson count of mean 0.8, in 1 − e^−0.8 = 55.1% of the steps. t = (40 − 5.93) / (1 − 0.4259)."""
    mixed = MixedSteps(token_s=np.array(57e-6), token_linear_s=np.array(50e-6), decode_linear_s=(0.010, 0.014),
                       slots=np.array(100.0), step_tokens=np.array(8192.0))
    t = mixed.steady_step_s(np.array(0.040), np.array(16.0), np.array(467.0), np.array(20.0), np.array(0.050))
    hidden = (0.010 + 0.004 * 19 / 99) * (1 - np.exp(-0.8))
    assert float(t) == pytest.approx((0.040 - hidden) / (1 - 16 * 467 * 57e-6), rel=1e-9)
    # prompts arriving faster than a step can take them: no steady state
    assert np.isinf(mixed.steady_step_s(np.array(0.040), np.array(40.0), np.array(467.0), np.array(20.0), np.array(0.05)))


def test_mixed_steps_stall_less_than_whole_prompts(db):
    """The same load on an engine that mixes prompts into decode steps (vLLM) and on one whose prefill steps
    run alone (SGLang): the stalls cost the second more time between tokens."""
    load = {"rate": 8.0, "prompt_tokens": 2048, "output_tokens": 256}
    mixing, alone = (estimate("llama-3.1-8b", "h100", engine=name, **load) for name in ("vLLM", "SGLang"))
    assert mixing.itl_s < alone.itl_s
    assert mixing.throughput_out_tps == pytest.approx(alone.throughput_out_tps) == 8.0 * 256   # both keep up


def test_a_prompt_in_a_mixed_step_is_never_quicker_than_its_prefill_alone(db):
    """A step that carries a prompt does all of that prompt's own work, so its first token never comes sooner
    than the prompt prefilled alone. The step's share of a prompt token (t_tok, priced on a full step) leaves out
    the fixed costs and the weights the step pays for it at low load, for a MoE model every expert a 1,000-token
    prompt touches beyond the decode's few: DeepSeek-V3 at one client on 8 H200 under vLLM came out at 68 ms,
    against 83.5 ms for the prompt alone."""
    for model, gpu, devices in (("deepseek-v3", "h200", 8), ("llama-3.1-8b", "h100", 1)):
        for clients in (1, 2, 8):
            r = estimate(model, gpu, n_gpus=devices, engine="vLLM", weight_format="fp8", concurrency=clients,
                         prompt_tokens=1000, output_tokens=1000, calibration="none").results
            assert min(r["ttft_s"], r["ttft_p50_s"]) >= r["ttft_prefill_s"], (model, clients)


def test_a_published_mixed_step_itl():
    """TensorRT-LLM 0.14 behind Triton, Llama-3.1-70B on 4 H100, 500 requests of 467 prompt and 256 output
    tokens at 16/s: a mean ITL of 66 ms. Whole-prompt stalls put it at 213 ms; mixed steps come within 40%."""
    rows = [r for r in csv.DictReader((ROOT / "measurements_db" / "datacenter-2025.csv").open(encoding="utf-8"))
            if r["id"] == "trt014srv-l31-70b-h100-tp4-467-256-qps16-itl"]
    out = predict_rows(rows)[0]
    assert out["status"] == "ok"
    assert 0.6 < float(out["predicted"]) / float(rows[0]["value"]) < 1.4


def test_a_finite_run_reports_its_throughput_over_its_duration(db):
    """500 requests at 16/s: the last arrives at 499/16 s, and the run ends when the last reply does, in a batch
    that thins as the others end: no later than one E2E at the steady pace, no sooner than a reply alone. Its
    output tokens/s is its tokens over that; an endless run keeps the steady state's and has no end."""
    load = {"rate": 16.0, "prompt_tokens": 467, "output_tokens": 256}
    endless = estimate("llama-3.1-70b", "h100", n_gpus=4, engine="TensorRT-LLM", **load)
    run = estimate("llama-3.1-70b", "h100", n_gpus=4, engine="TensorRT-LLM", num_requests=500, **load)
    alone = estimate("llama-3.1-70b", "h100", n_gpus=4, engine="TensorRT-LLM", prompt_tokens=467, output_tokens=256)
    assert endless.throughput_out_tps == pytest.approx(16.0 * 256)
    assert math.isnan(endless.results["run_duration_s"])
    duration = float(run.results["run_duration_s"])
    assert 499 / 16.0 + run.ttft_s + 255 * alone.itl_s < duration < 499 / 16.0 + run.e2e_latency_s
    assert run.throughput_out_tps == pytest.approx(500 * 256 / duration, rel=1e-6)


def test_mixed_steps_gaps_are_bare_steps_or_steps_with_prompts(db):
    """8 prompts of 2,048 tokens a second on vLLM: most steps carry no prompt (the median gap is a bare decode
    step, below the mean), the 90th percentile is a step that carries one prompt and the 99th one that carries
    two, each prompt adding its prefill in a full step (less the decode's linear layers, hidden once)."""
    e = estimate("llama-3.1-8b", "h100", engine="vLLM", rate=8.0, prompt_tokens=2048, output_tokens=256)
    assert e.itl_p50_s < e.itl_s < e.itl_p90_s < e.itl_p99_s
    assert e.itl_p99_s - e.itl_p50_s == pytest.approx(2 * (e.itl_p90_s - e.itl_p50_s), rel=0.1)


def test_the_time_breakdown_names_the_batch_it_is_at(db):
    """Under a load the breakdown's prefill is every running sequence's prompt at once (15.7 of them here, about
    16 prompts' time), far longer than the TTFT one prompt sees, so its column says so; at one sequence it does
    not."""
    from estimator.reporting.estimate_text import format_estimate
    loaded = estimate("llama-3.1-8b", "H100 SXM", concurrency=16, prompt_tokens=1000, output_tokens=200)
    batch = loaded.results["steady_batch"]
    text = format_estimate(loaded)
    assert f"prefill of {batch:,.4g} prompts at once: compute-bound" in text
    assert f"decode step of {batch:,.4g} sequences: memory-bound" in text
    header = text.split("Where the time goes\n")[1].splitlines()[0]
    assert header.split() == ["prefill", "of", f"{batch:,.4g}", "prompts", "at", "once", "decode", "step", "of",
                              f"{batch:,.4g}", "sequences"]
    assert loaded.results["prefill_linear_s"] > 10 * loaded.results["ttft_prefill_s"] > 0
    alone = format_estimate(estimate("llama-3.1-8b", "H100 SXM", prompt_tokens=1000, output_tokens=200))
    header = alone.split("Where the time goes\n")[1].splitlines()[0]
    assert header.split() == ["prefill", "decode", "step"]
    assert "\n  prefill: compute-bound" in alone and "\n  decode step: memory-bound" in alone
