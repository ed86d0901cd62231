"""A finite closed loop: N requests through C clients, the first C sent at once (estimator/serving/first_wave.py).

Measured agreement of the model with the simulation (C = 16 clients; prompts uniform from 1 to 2,000 tokens,
outputs from 2 to 400; 40 seeds each), model ÷ simulation − 1, for N = 32 / 48 / 160 / 480 requests: mean TTFT
−0.4 / +0.4 / +3.7 / +7.1%, median +7.7 / +5.4 / −1.4 / −0.3%, p90 −3.7 / +4.1 / +70 / +40%, the run's
duration −2.5 / −2.5 / −1.6 / −0.4%. At 160 and 480 requests the wave is a tenth and a thirtieth of them, and
the pooled p90 lies near the steady state's p99, which the model overstates by itself (simulated without a first
wave: mean 28.2 ms, p50 27.3, p90 45.0, p99 65.8; the model 30.7, 27.0, 51.5, 111: a request's own prefill at its
p99 added to the queue's p99, an upper estimate, docs/formulas.md §14).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from estimator import estimate
from estimator.serving.burst import all_at_once
from estimator.serving.continuous_batching import steady_state
from estimator.serving.first_wave import first_wave_ttft, last_start_s
from estimator.serving.lengths import LengthMix, request_spread, run_outputs
from estimator.serving.run_end import Residuals, finite_run_s
from estimator.serving.simulation import simulate

RNG = np.random.default_rng(5)
PROMPTS = RNG.integers(1, 2001, 400).astype(float)
OUTPUTS = RNG.integers(2, 401, 400).astype(float)
PREFILLS = 0.002 + 20e-6 * PROMPTS
CLIENTS = 16


def itl(n):
    return 0.010 + 0.00002 * np.asarray(n, dtype=float)


def _model(requests: int) -> dict:
    """The estimate's parts for this loop: the steady state, the first wave, their pooled TTFT and the run's end."""
    spread = request_spread(PREFILLS, OUTPUTS)
    state = steady_state(itl, np.array(spread["prefill_s"]), np.array(PROMPTS.mean()), OUTPUTS.mean(),
                         float(CLIENTS), 0.0, np.array(1e6), 0.0, prefill_scv=spread["scv"])
    steady = {"ttft_s": state["ttft_s"],
              **{f"ttft_{q}_s": state[f"ttft_{q}_s"] + spread[f"prefill_{q}_shift_s"] for q in ("p50", "p90", "p99")}}
    # the simulation prefills the wave's prompts one at a time, before any decode step
    mix = LengthMix(PROMPTS, OUTPUTS)
    wave = all_at_once(CLIENTS, CLIENTS * spread["prefill_s"], PROMPTS.mean(), OUTPUTS.mean(), PROMPTS.mean(),
                       itl(1), itl(CLIENTS), False, run_outputs(mix, CLIENTS))
    out = first_wave_ttft(CLIENTS / requests, wave, steady, spread["prefill_s"])
    X = state["request_rate"]
    start = last_start_s(requests, CLIENTS, X, OUTPUTS.var() / OUTPUTS.mean() ** 2)
    out["duration_s"] = finite_run_s(requests, X, state["itl_s"], state["ttft_s"], itl(1), itl(CLIENTS),
                                     float(CLIENTS), Residuals.of(OUTPUTS - 1), 1.0, last_start_s=start)
    return {k: float(v) for k, v in out.items()}


def _simulated(requests: int, seeds: int = 40) -> dict:
    runs = [simulate(itl, PREFILLS, PROMPTS, OUTPUTS, concurrency=CLIENTS, requests=requests, warmup=0.0,
                     seed=seed, start_together=True) for seed in range(seeds)]
    assert not any(r["truncated"] for r in runs)
    ttft = np.concatenate([r["ttft_s"] for r in runs])
    return {"ttft_s": float(ttft.mean()), "ttft_p50_s": float(np.median(ttft)),
            "ttft_p90_s": float(np.quantile(ttft, 0.9)),
            "duration_s": float(np.mean([r["duration_s"] for r in runs]))}


@pytest.mark.parametrize("requests, keys", [
    (32, ("ttft_s", "ttft_p50_s", "ttft_p90_s", "duration_s")),
    (48, ("ttft_s", "ttft_p50_s", "ttft_p90_s", "duration_s")),
    # a wave of a tenth of the requests puts the pooled p90 at the steady state's p99, itself an upper estimate
    (160, ("ttft_s", "ttft_p50_s", "duration_s")),
    (480, ("ttft_s", "ttft_p50_s", "duration_s")),
])
def test_the_first_wave_agrees_with_the_simulation(requests, keys):
    model, sim = _model(requests), _simulated(requests)
    tolerances = {"ttft_s": 0.1, "ttft_p50_s": 0.1, "ttft_p90_s": 0.1, "duration_s": 0.04}
    for key in keys:
        assert model[key] == pytest.approx(sim[key], rel=tolerances[key]), (key, model[key], sim[key])


def test_the_pooled_ttft_runs_from_the_steady_state_to_the_wave():
    """No wave (w = 0) is the steady state; all wave (w = 1) is the all-at-once run's positions; between, the
    mean is linear in w and no quantile falls as w grows, when the wave waits longer than the steady state."""
    wave = {"ttft_s": np.array(2.0), "ttft_each_s": np.linspace(0.5, 3.5, 64)}
    steady = {"ttft_s": np.array(0.12), "ttft_p50_s": np.array(0.1), "ttft_p90_s": np.array(0.2),
              "ttft_p99_s": np.array(0.4)}
    none, some, more, every = (first_wave_ttft(w, wave, steady, 0.05) for w in (0.0, 0.1, 0.3, 1.0))
    assert none["ttft_s"] == pytest.approx(0.12) and every["ttft_s"] == pytest.approx(2.0)
    assert none["ttft_p50_s"] == pytest.approx(0.1, rel=0.02) and none["ttft_p99_s"] == pytest.approx(0.4, rel=0.02)
    assert every["ttft_p50_s"] == pytest.approx(np.quantile(wave["ttft_each_s"], 0.5), rel=0.03)
    assert some["ttft_s"] == pytest.approx(0.1 * 2.0 + 0.9 * 0.12)
    for q in ("p50", "p90", "p99"):
        assert none[f"ttft_{q}_s"] <= some[f"ttft_{q}_s"] <= more[f"ttft_{q}_s"] <= every[f"ttft_{q}_s"] + 1e-12


def test_the_last_start_lags_a_steady_pace_by_half_a_request_when_all_are_alike():
    """By renewal theory a client's n-th request ends near n μ − (1 − c²) μ / 2 when its first starts at 0."""
    assert float(last_start_s(320, 64, 4.0, 0.0)) == pytest.approx(256 / 4 + 8)
    assert float(last_start_s(320, 64, 4.0, 1.0)) == pytest.approx(256 / 4)      # exponential times: no lag


def test_a_closed_loop_with_a_number_of_requests(capsys):
    """--num-requests with --concurrency: the first C at once raise the mean TTFT above the endless loop's, and
    the run reports its duration; no more requests than clients is the all-at-once run of them."""
    from tests.helpers import cli
    kwargs = dict(engine="vLLM", concurrency=16, lengths="random@2000/500")
    endless = estimate("llama-3.1-8b", "h100", **kwargs).results
    finite = estimate("llama-3.1-8b", "h100", num_requests=80, **kwargs).results
    longer = estimate("llama-3.1-8b", "h100", num_requests=800, **kwargs).results
    assert finite["ttft_s"] > longer["ttft_s"] > endless["ttft_s"]
    assert finite["ttft_p99_s"] > endless["ttft_p99_s"]
    assert np.isnan(endless["run_duration_s"]) and finite["run_duration_s"] > 80 / finite["request_rate"] * 0.9
    # the first 16 wait for each other's prompts: their mean TTFT is above the run's, which pools them with the rest
    assert np.isnan(endless["first_wave_ttft_s"]) and finite["first_wave_ttft_s"] > finite["ttft_s"]
    sent = estimate("llama-3.1-8b", "h100", num_requests=10, **kwargs).results
    alone = estimate("llama-3.1-8b", "h100", num_requests=10, engine="vLLM", lengths="random@2000/500").results
    assert sent["ttft_s"] == pytest.approx(alone["ttft_s"]) and sent["throughput_out_tps"] == pytest.approx(
        alone["throughput_out_tps"])
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--concurrency", "16",
                       "--num-requests", "80")
    assert code == 0 and "16 requests in flight, 80 in all, the first 16 sent at once" in out
    assert "output tokens/s over the run of 80 requests" in out and "TTFT of the first requests, sent at once" in out


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["llama-3.1-8b", "qwen3-30b-a3b", "mistral-7b-v0.3"]), st.sampled_from(["h100", "a100", "l40s"]),
       st.sampled_from(["vLLM", "SGLang", "TensorRT-LLM"]), st.integers(2, 128), st.integers(2, 40),
       st.sampled_from([None, "random@1500/300", "sharegpt-bench"]))
def test_a_finite_closed_loop_is_finite_ordered_and_tends_to_the_endless_loop(model, gpu, engine, clients, per_client,
                                                                            lengths):
    """Whatever the configuration: finite, ordered percentiles, a run at least as long as its renewals, and a run
    a thousand times longer whose TTFT is the endless loop's."""
    kwargs = dict(engine=engine, concurrency=clients, prompt_tokens=1500, output_tokens=300) if lengths is None else \
        dict(engine=engine, concurrency=clients, lengths=lengths)
    finite = estimate(model, gpu, num_requests=clients * per_client, **kwargs).results
    assume(finite["fits"])
    for key in ("ttft_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "run_duration_s", "throughput_out_tps",
                "e2e_latency_s", "e2e_p99_s"):
        assert np.isfinite(finite[key]) and finite[key] > 0, key
    assert finite["ttft_p50_s"] <= finite["ttft_p90_s"] <= finite["ttft_p99_s"] * (1 + 1e-12)
    assert finite["run_duration_s"] >= clients * (per_client - 1) / finite["request_rate"] * (1 - 1e-9)
    endless = estimate(model, gpu, **kwargs).results
    longer = estimate(model, gpu, num_requests=clients * 100_000, **kwargs).results
    assert longer["ttft_s"] == pytest.approx(endless["ttft_s"], rel=0.01)
    assert longer["throughput_out_tps"] == pytest.approx(endless["throughput_out_tps"], rel=0.01)
