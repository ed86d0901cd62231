"""How a finite open-loop benchmark ends (`--num-requests N` with `--rate R`): by hand, against a step-by-step
replay of arrivals joining a running batch whose steps grow with it, and on a published run."""

import csv
from pathlib import Path

import numpy as np
import pytest

from estimator import estimate
from estimator.serving.lengths import length_mix
from estimator.serving.run_end import Residuals, finite_run_s
from estimator.validation.predict import predict_rows

ROOT = Path(__file__).resolve().parents[1]


def test_equal_replies_at_one_pace_end_a_reply_after_the_last_arrival():
    """With every step as long at one sequence as at the full batch, the last request's reply sets the end."""
    end = finite_run_s(200, 16.0, 0.02, 0.05, 0.02, 0.02, 32.0, Residuals.of(np.ones(1)), 99.0)
    assert end == pytest.approx(199 / 16 + 0.05 + 99 * 0.02)


def test_a_thinning_batch_ends_sooner_and_a_longer_reply_later():
    equal = Residuals.of(np.ones(1))
    flat = finite_run_s(200, 16.0, 0.02, 0.05, 0.02, 0.02, 32.0, equal, 99.0)
    thinning = finite_run_s(200, 16.0, 0.02, 0.05, 0.01, 0.02, 32.0, equal, 99.0)
    spread = Residuals.of(np.array([20.0, 60.0, 100.0, 220.0]))      # the same mean, 99.0 + 0.25
    assert thinning < flat < finite_run_s(200, 16.0, 0.02, 0.05, 0.01, 0.02, 32.0, spread, 1.0)


def test_a_run_never_holds_more_sequences_than_it_has_requests():
    """Two requests at 1,000 a second: whatever batch the steady state would reach, the two replies end about when
    one alone would (100 steps of 10 ms after a 50 ms first token), not in a tail that thins from 2,000."""
    end = finite_run_s(2, 1000.0, 0.02, 0.05, 0.01, 0.02, 2000.0, Residuals.of(np.ones(1)), 100.0)
    assert 0.001 + 0.05 + 100 * 0.01 <= end < 0.001 + 0.05 + 100 * 0.0101


def _replay(arrivals_s, outputs, d1, slope):
    """Requests join the running batch at the first step boundary after they arrive and leave after their
    decode steps; a step of n sequences takes d1 + slope (n − 1). Returns the end, the mean step and the mean
    batch while requests still arrive."""
    clock, left, i, steps, batches = 0.0, [], 0, [], []
    order = np.argsort(arrivals_s)
    while i < len(order) or left:
        while i < len(order) and arrivals_s[order[i]] <= clock:
            left.append(outputs[order[i]])
            i += 1
        if not left:
            clock = arrivals_s[order[i]]
            continue
        step = d1 + slope * (len(left) - 1)
        if i < len(order):
            steps.append(step)
            batches.append(len(left))
        clock += step
        left = [r - 1 for r in left if r > 1]
    return clock, float(np.mean(steps)), float(np.mean(batches))


@pytest.mark.parametrize("shape", ["equal", "uniform", "sharegpt-bench"])
@pytest.mark.parametrize("rate", [4.0, 25.0])
def test_the_end_matches_a_step_replay(shape, rate):
    rng = np.random.default_rng(7)
    n, d1, slope = 300, 0.010, 0.0001     # X · slope · E[O] < 1: a steady batch exists
    if shape == "equal":
        draw = lambda: np.full(n, 150)                                           # noqa: E731
    elif shape == "uniform":
        draw = lambda: rng.integers(1, 401, n)                                   # noqa: E731
    else:
        mix = length_mix(shape)
        draw = lambda: rng.choice(mix.output_tokens.astype(int), n)              # noqa: E731
    ends, predicted = [], []
    for _ in range(12):
        outputs = draw()
        arrivals = np.cumsum(rng.exponential(1 / rate, n)) - 1 / rate            # Poisson, the first at about 0
        end, step, batch = _replay(arrivals, outputs, d1, slope)
        ends.append(end)
        residuals = Residuals.of(np.array([1.0])) if shape == "equal" else Residuals.of(outputs.astype(float))
        scale = 150.0 if shape == "equal" else 1.0
        X = (n - 1) / arrivals[-1]
        predicted.append(finite_run_s(n, X, step, 0.0, d1, d1 + slope * (batch - 1), batch, residuals, scale))
    assert np.mean(predicted) == pytest.approx(np.mean(ends), rel=0.05)


def test_a_published_finite_run_reports_its_output_over_its_duration(db):
    """io.net's 200 ShareGPT requests at 32 a second to Llama-3-8B on one H100 PCIe (vLLM 0.8.5): 2,693 output
    tokens a second. The steady state's rate over the run's arrivals plus a mean reply gave 4,129 (53% high):
    the longest replies, not the mean one, end the run."""
    rows = [r for r in csv.DictReader((ROOT / "measurements_db" / "thirdparty-datacenter-engines.csv")
                                      .open(encoding="utf-8")) if r["id"] == "iog-h100pcie-x1-llama3-8b-qps32-thr"]
    (result,) = predict_rows(rows, db)
    assert result["status"] == "ok" and float(result["predicted"]) == pytest.approx(float(rows[0]["value"]), rel=0.10)


def test_a_run_shorter_than_its_steady_batch_runs_at_its_own_requests(db):
    """Llama-3.1-8B on an H100 under vLLM at 24 requests a second (512 prompt, 256 output tokens) settles at about
    85 running. A run of only 50 never gets there: its batch is its 50 requests, and its step keeps the steady
    state's share of prompts on a decode step of 50 (slower than a bare step of 50, faster than the steady one). A
    run of 100 reaches the steady state and keeps it."""
    load = dict(engine="vLLM", prompt_tokens=512, output_tokens=256, rate=24.0)
    endless = estimate("llama-3.1-8b", "h100", **load)
    short, long = (estimate("llama-3.1-8b", "h100", num_requests=n, **load) for n in (50, 100))
    bare = estimate("llama-3.1-8b", "h100", engine="vLLM", prompt_tokens=512, output_tokens=256, batch=50)
    assert endless.results["steady_batch"] > 80 and short.results["steady_batch"] == 50
    assert bare.itl_s < short.itl_s < endless.itl_s
    assert short.itl_p50_s <= short.itl_p90_s and short.itl_p90_s < endless.itl_p90_s
    assert long.itl_s == endless.itl_s and long.results["steady_batch"] == endless.results["steady_batch"]
