"""An all-at-once run (`--num-requests N`, no load): its two phases, checked by hand, against a step-by-step
replay of the same scheduler, in `estimate` and the CLI, and against a published vllm bench serve run."""

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from estimator import estimate
from estimator.errors import UnknownNameError
from estimator.serving.burst import all_at_once, backlog
from estimator.serving.lengths import LengthMix, run_outputs
from estimator.validation.dataset import load_dataset
from estimator.validation.predict import predict_rows
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[1]


def test_hand_worked_run():
    """100 prompts of 1,000 tokens in steps of 10,000 tokens: 10 steps of 0.2 s. Prefill steps alone: the mean
    first token comes at (1 + 2 + … + 10) / 10 · 0.2 s = 1.1 s, everyone decodes 10 tokens from 2 s at the
    batch-100 step of 30 ms, so E2E = 2.3 s and the mean TPOT (2.3 − 1.1) / 10 = 0.12 s."""
    alone = all_at_once(100, 2.0, 1000, 11, 10_000, 0.010, 0.030, False)
    assert alone["ttft_s"] == pytest.approx(1.1) and alone["tpot_s"] == pytest.approx(0.12)
    assert alone["e2e_latency_s"] == pytest.approx(2.3) and alone["duration_s"] == pytest.approx(2.3)
    assert alone["throughput_out_tps"] == pytest.approx(100 * 11 / 2.3)
    mixed = all_at_once(100, 2.0, 1000, 11, 10_000, 0.010, 0.030, True)
    # the same first tokens; the early requests finish during the prompts, so the mean E2E is shorter
    assert mixed["ttft_s"] == pytest.approx(1.1) and mixed["e2e_latency_s"] < alone["e2e_latency_s"]
    # a single step: every request waits for all prompts, whichever way steps are run
    one_step = all_at_once(100, 2.0, 1000, 11, np.inf, 0.010, 0.030, [False, True])
    assert one_step["ttft_s"] == pytest.approx([2.0, 2.0])
    # one output token: no gap to time, the decode step at the batch stands for it (never 0 or infinite speeds)
    assert all_at_once(100, 2.0, 1000, 1, 10_000, 0.010, 0.030, True)["tpot_s"] == pytest.approx(0.030)


def _replay(n, prefill_s, P, O, K, d1, dn, mixed):
    """Every token's time, step by step: K prompt tokens a step in arrival order, one token a step for each
    admitted request (mixed) or none until the prompts are done, then decode steps of
    d(n') = d1 + (dn − d1)(n' − 1)/(n − 1)."""
    steps = int(np.ceil(n * P / K))
    slope = (dn - d1) / (n - 1)
    step_s = max(prefill_s / steps, d1 + slope * max(n / 2 - 1, 0)) if mixed else prefill_s / steps
    first = [int(np.floor(((j + 1) * P - 1) / K)) + 1 for j in range(n)]
    ttft = [f * step_s for f in first]
    outputs = [int(o) for o in O] if np.ndim(O) else [O] * n         # per request, in admission order
    early = [min(steps - f, o - 1) if mixed else 0 for f, o in zip(first, outputs)]   # tokens during the prompts
    tokens = [[ttft[j] + k * step_s for k in range(early[j] + 1)] for j in range(n)]
    left = [outputs[j] - 1 - early[j] for j in range(n)]
    t = steps * step_s
    while any(x > 0 for x in left):
        active = [j for j in range(n) if left[j] > 0]
        t += d1 + slope * (len(active) - 1)
        for j in active:
            left[j] -= 1
            tokens[j].append(t)
    done = [times[-1] for times in tokens]
    tpot = [(done[j] - ttft[j]) / (outputs[j] - 1) if outputs[j] > 1 else dn for j in range(n)]
    gaps = np.concatenate([np.diff(times) for times in tokens])
    return np.mean(ttft), np.mean(tpot), np.mean(done), max(done), ttft, gaps


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("P,O,K", [(300, 30, 2048), (128, 4, 8192), (2000, 100, 8192)])
def test_the_run_matches_a_step_replay(mixed, P, O, K):
    n, prefill_s, d1, dn = 64, 0.004 * 64 * P / 100, 0.008, 0.030
    model = all_at_once(n, prefill_s, P, O, K, d1, dn, mixed)
    ttft, tpot, e2e, duration, each_ttft, gaps = _replay(n, prefill_s, P, O, K, d1, dn, mixed)
    assert float(model["ttft_s"]) == pytest.approx(ttft, rel=0.05)
    assert float(model["tpot_s"]) == pytest.approx(tpot, rel=0.05)
    assert float(model["e2e_latency_s"]) == pytest.approx(e2e, rel=0.05)
    assert float(model["duration_s"]) == pytest.approx(duration, rel=0.05)
    for q, p in (("p50", 0.5), ("p90", 0.9)):
        assert float(model[f"ttft_{q}_s"]) == pytest.approx(np.quantile(each_ttft, p), rel=0.1)
    for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):     # every gap between two tokens of a request
        assert float(model[f"itl_{q}_s"]) == pytest.approx(np.quantile(gaps, p), rel=0.05)


@pytest.mark.parametrize("mixed", [False, True])
def test_a_run_of_unequal_outputs_matches_a_step_replay(mixed):
    """Requests of unequal outputs, admitted in an order unrelated to their lengths (the model's stride through
    them): the batch thins as the short ones end and the run lasts until the longest does."""
    n, P, K, d1, dn = 64, 300, 2048, 0.008, 0.030
    outputs = np.array([2 + (37 * j) % 200 for j in range(n - 1)] + [900.0])
    model = all_at_once(n, 0.004 * n * P / 100, P, outputs.mean(), K, d1, dn, mixed, outputs)
    stride = 33   # the model's: the first k above n / 2 coprime with n
    admitted = outputs[(np.arange(n) * stride) % n]
    ttft, tpot, e2e, duration, _, _ = _replay(n, 0.004 * n * P / 100, P, admitted, K, d1, dn, mixed)
    assert float(model["duration_s"]) == pytest.approx(duration, rel=0.03)
    assert float(model["e2e_latency_s"]) == pytest.approx(e2e, rel=0.05)
    assert float(model["tpot_s"]) == pytest.approx(tpot, rel=0.05)
    assert float(model["throughput_out_tps"]) == pytest.approx(outputs.sum() / duration, rel=0.03)


def test_a_straggler_sets_the_end_of_the_run():
    """Four requests sent at once with 10, 20, 30 and 400 output tokens, one 10 ms step whatever the batch, the
    prompts in one 10 ms step: the run ends when the 400-token request does, after 0.01 + 399 x 0.01 = 4.0 s, so
    it yields 460 tokens in 4 s (115 tokens/s), where four requests of the mean 115 tokens would end at 1.15 s
    (400 tokens/s). A file of exactly the run's requests gives them back as the run's positions."""
    mix = LengthMix(np.full(4, 100.0), np.array([10.0, 20.0, 30.0, 400.0]))
    positions = run_outputs(mix, 4)
    assert sorted(set(positions)) == [10.0, 20.0, 30.0, 400.0] and positions.mean() == pytest.approx(115.0)
    spread = all_at_once(4, 0.01, 100, 115, 10_000, 0.01, 0.01, False, positions)
    alike = all_at_once(4, 0.01, 100, 115, 10_000, 0.01, 0.01, False)
    assert float(spread["duration_s"]) == pytest.approx(0.01 + 399 * 0.01)
    assert float(spread["throughput_out_tps"]) == pytest.approx(460 / 4.0)
    assert float(alike["duration_s"]) == pytest.approx(0.01 + 114 * 0.01)
    # at the same mean, more spread never ends the run sooner
    wider = LengthMix(np.full(4, 100.0), np.array([1.0, 1.0, 58.0, 400.0]))
    assert float(all_at_once(4, 0.01, 100, 115, 10_000, 0.01, 0.01, False, run_outputs(wider, 4))["duration_s"]) \
        >= float(spread["duration_s"])


def test_hand_worked_backlog():
    """1,000 prompts of 1,000 tokens, 11 output tokens, 100 slots, 2,000 tokens a step, prefill 0.1 ms a token
    (all linear layers), decode 10 ms at 1 and 30 ms at 100 (8 and 10 ms linear). The budget binds:
    a = 2000 / 1010 = 1.9802 prompts a step, n = 10 a = 19.80 decoding, d(n) = 13.798 ms of which 8.380 ms
    linear. A step carries a Poisson count of prompts, none with chance e^−a = 0.1381; one prompt's linear
    layers (0.1 s) outlast the decode's, which hide in every step with a prompt: t̄ = 13.798 + 198.02 −
    8.380 · 0.8619 = 204.595 ms, X = a / t̄ = 9.6786 requests/s, TTFT = 1001 / (2X) = 51.71 s. A request's decode
    window takes the other 99 slots' prompts, 0.99 a = 1.9604 a step: TPOT = 13.798 + 196.04 − 8.380 ·
    (1 − e^−1.9604) = 202.64 ms."""
    mixed = backlog(1000, 100, 10.0, 10.0, 1000, 11, 2000, (0.010, 0.030), (0.008, 0.010), True)
    assert float(mixed["tpot_s"]) == pytest.approx(0.20264, rel=1e-3)
    assert float(mixed["ttft_s"]) == pytest.approx(51.71, rel=1e-3)
    assert float(mixed["duration_s"]) == pytest.approx(1000 / 9.6786 + 10 * 0.204595, rel=1e-3)
    # prefill steps alone: nothing hides, the step is the sum
    alone = backlog(1000, 100, 10.0, 10.0, 1000, 11, 2000, (0.010, 0.030), (0.008, 0.010), False)
    assert float(alone["duration_s"]) == pytest.approx(1000 / (1.9802 / 0.211818) + 10 * 0.211818, rel=1e-3)
    # one slot: a request decodes alone after its prompt, a bare decode step a token
    one = backlog(2000, 1, 0.2, 0.14, 1000, 50, 8192, (0.010, 0.010), (0.008, 0.008), True)
    assert float(one["tpot_s"]) == pytest.approx(0.010) and float(one["itl_p99_s"]) == pytest.approx(0.010)


def _replay_backlog(n, S, P, O, K, prefill_s, prefill_linear_s, decode_s, decode_linear_s, mixed):
    """Every token's time, step by step: a FIFO of n requests, at most S holding a slot from their first prompt
    token to their last token, each step K tokens: one for each decoding request, the rest for the oldest
    prompts; a step costs d(n') plus its prompt tokens at prefill_s / (S P) each, less the hidden linear part.
    Output lengths are drawn evenly from O/2 to 3O/2 (as a benchmark without --ignore-eos has them): equal ones
    would keep the requests admitted together finishing together, cohorts no real run keeps."""
    token_s, token_linear_s = prefill_s / (S * P), prefill_linear_s / (S * P)
    outputs = np.random.default_rng(0).integers(max(O // 2, 2), O + O // 2 + 1, n)

    def at(pair, running):
        return pair[0] + ((pair[1] - pair[0]) * (running - 1) / (S - 1) if S > 1 else 0.0)

    waiting, prefilling, decoding, prompt_left = list(range(n)), [], {}, {}
    first, last, done, gaps, t = {}, {}, {}, [], 0.0
    while len(done) < n:
        running, taken = len(decoding), 0
        for j in prefilling:
            take = min(prompt_left[j], K - running - taken)
            prompt_left[j] -= take
            taken += take
        while waiting and taken < K - running and len(prefilling) + running < S:
            j = waiting.pop(0)
            prefilling.append(j)
            take = min(P, K - running - taken)
            prompt_left[j], taken = P - take, taken + take
        hidden = min(at(decode_linear_s, running), taken * token_linear_s) if mixed and running else 0.0
        t += (at(decode_s, running) if running else 0.0) + taken * token_s - hidden
        for j in list(decoding):
            decoding[j] -= 1
            gaps.append(t - last[j])
            last[j] = t
            if decoding[j] == 0:
                done[j] = t
                del decoding[j]
        for j in [j for j in prefilling if prompt_left[j] == 0]:
            prefilling.remove(j)
            first[j] = last[j] = t
            decoding[j] = outputs[j] - 1
    ttft = np.array([first[j] for j in range(n)])
    e2e = np.array([done[j] for j in range(n)])
    return ttft, (e2e - ttft) / (outputs - 1), e2e, outputs.mean(), np.array(gaps)


@pytest.mark.parametrize("S,P,O,K,mixed", [(50, 1000, 50, 8192, True), (50, 1000, 50, 8192, False),
                                           (200, 128, 4, 8192, True), (8, 32000, 100, 8192, True),
                                           (100, 200, 200, 2048, True), (100, 2000, 200, 8192, False),
                                           (1, 1000, 50, 8192, True)])
def test_the_backlog_matches_a_step_replay(S, P, O, K, mixed):
    """The backlog's means and percentiles against the step-by-step replay of the same scheduler, both limits
    binding in turn. Where each step takes many prompts (P = 128), the model takes their count as its mean:
    the gaps are not compared there."""
    n, prefill_s, decode_s, decode_linear_s = 1000, 0.0002 * S * P, (0.010, 0.030), (0.008, 0.012)
    ttft, tpot, e2e, mean_output, gaps = _replay_backlog(n, S, P, O, K, prefill_s, 0.7 * prefill_s, decode_s,
                                                         decode_linear_s, mixed)
    model = backlog(n, S, prefill_s, 0.7 * prefill_s, P, mean_output, K, decode_s, decode_linear_s, mixed)
    assert float(model["ttft_s"]) == pytest.approx(ttft.mean(), rel=0.12)
    assert float(model["tpot_s"]) == pytest.approx(tpot.mean(), rel=0.12)
    assert float(model["e2e_latency_s"]) == pytest.approx(e2e.mean(), rel=0.12)
    assert float(model["duration_s"]) == pytest.approx(e2e.max(), rel=0.15)   # the last request's length varies
    for q, p in (("p50", 0.5), ("p90", 0.9)):
        assert float(model[f"ttft_{q}_s"]) == pytest.approx(np.quantile(ttft, p), rel=0.12)
    if P > 128:
        for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):     # every gap between two tokens of a request
            assert float(model[f"itl_{q}_s"]) == pytest.approx(np.quantile(gaps, p), rel=0.05)


def test_estimate_of_an_all_at_once_run(db):
    common = {"prompt_tokens": 215, "output_tokens": 194, "engine": "vLLM"}
    run = estimate("llama-3.1-8b", "h100", num_requests=500, **common)
    r = run.results
    # all 500 run: the KV cache holds 1,010 such sequences beside vLLM's sampler warm-up, the scheduler 1,024
    assert r["running_batch"] == 500 and r["queued_requests"] == 0 and r["max_running_sequences"] == 1010
    batch = estimate("llama-3.1-8b", "h100", batch=500, **common)
    # the prompts take the batch's prefill; the mean first token comes about halfway through it
    assert r["prefill_phase_s"] == pytest.approx(batch.ttft_s, rel=0.05)
    assert 0.4 * batch.ttft_s < run.ttft_s < 0.7 * batch.ttft_s
    # a token after the first costs at least a bare decode step at one sequence, and early tokens wait
    assert run.itl_s > estimate("llama-3.1-8b", "h100", batch=1, **common).itl_s
    assert run.throughput_out_tps < 500 / batch.itl_s
    # beyond the engine's running limit the rest wait for a slot
    capped = estimate("llama-3.1-8b", "h100", num_requests=500, max_num_seqs=100, **common)
    assert capped.results["queued_requests"] == 400 and capped.ttft_s > run.ttft_s
    assert capped.throughput_out_tps < run.throughput_out_tps


def test_the_cli_takes_num_requests_alone(capsys):
    args = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--engine", "sglang", "--num-requests", "300"]
    code, out, _ = cli(capsys, *args)
    assert code == 0 and "300 requests sent at once" in out and "ITL (mean gap over every output token)" in out \
        and "run ends when its longest reply does, after" in out
    code, out, _ = cli(capsys, *args, "--max-num-seqs", "64", "--json")
    result = json.loads(out)
    assert code == 0 and result["running_batch"] == 64 and result["queued_requests"] == 236
    # through 8 clients the 300 run as a finite closed loop (tests/test_first_wave.py), through 300 all at once
    code, out, _ = cli(capsys, *args, "--concurrency", "8")
    assert code == 0 and "8 requests in flight, 300 in all, the first 8 sent at once" in out
    code, out, _ = cli(capsys, *args, "--concurrency", "300")
    assert code == 0 and "300 requests sent at once" in out


def test_a_published_all_at_once_run():
    """GPUStack's vllm bench serve of gpt-oss-20b on one H100 (vLLM 0.10.2, 1,000 requests of 128 prompt and 4
    output tokens sent at once): mean TPOT 178.9 ms, because every request's few tokens come during the
    prompts' steps. A decode step at the running batch (what a fixed batch predicts) is 8x below it."""
    rows = [r for r in csv.DictReader((ROOT / "measurements_db" / "datacenter-2025.csv").open(encoding="utf-8"))
            if r["id"] == "gpustack-gptoss20b-h100-base-r128-itl"]
    measured = float(rows[0]["value"])
    out = predict_rows(rows)[0]
    assert out["status"] == "ok" and out["reason"].startswith("1,000 requests sent at once; the engine runs at most")
    assert 0.3 < float(out["predicted"]) / measured < 1.5
    fixed = estimate("gpt-oss-20b", "h100", weight_format="mxfp4-experts", engine="vLLM", prompt_tokens=128,
                     output_tokens=4, batch=1000)
    assert fixed.itl_s * 1e3 < 0.2 * measured


def test_a_published_burst_ends_with_its_longest_reply(db):
    """LambdaLabs' vLLM 0.5.4 bursts of ShareGPT prompts on one H100 (Mistral-7B) publish every request's lengths:
    10 requests whose longest reply is 928 tokens lasted 7.39 s (336.7 output tokens/s), 160 requests with a
    1,028-token longest reply 14.45 s (2,353 tokens/s). Given the run's own lengths (its lengths file) the estimate
    runs the batch down to that reply, each step paying 0.5.4's output processing per sequence (docs/formulas.md
    section 14): 372 tokens/s (+11%) and 2,688 (+14%). Given only the mean lengths every reply ends together, 3.6x
    and 2.1x too fast."""
    ids = {"lambda-h100x1-mistral7b-p10-thr": (0.20, 3.0), "lambda-h100x1-mistral7b-p160-thr": (0.25, 1.8)}
    rows = [r for r in load_dataset().rows if r["id"] in ids]
    assert len(rows) == len(ids) and all(r["lengths"].startswith("lengths/") for r in rows)
    for row, own, mean_only in zip(rows, predict_rows(rows, db), predict_rows([{**r, "lengths": ""} for r in rows], db)):
        measured, (within, too_fast) = float(row["value"]), ids[row["id"]]
        assert abs(float(own["predicted"]) / measured - 1) < within, (row["id"], own["predicted"])
        assert float(mean_only["predicted"]) / measured > too_fast


def test_more_requests_at_once_never_come_sooner(db):
    """More requests sent at once: a later mean first token and a longer run, across the running limit too."""
    runs = [estimate("qwen2.5-7b", "l40s", engine=name, num_requests=n, prompt_tokens=1024, output_tokens=128)
            for name in ("vLLM", "SGLang") for n in (8, 64, 256, 1024)]
    for engine_runs in (runs[:4], runs[4:]):
        ttft = [r.ttft_s for r in engine_runs]
        e2e = [r.e2e_latency_s for r in engine_runs]
        assert ttft == sorted(ttft) and e2e == sorted(e2e)
        assert all(np.isfinite(r.itl_s) and r.itl_s > 0 for r in engine_runs)


def test_a_closed_loop_in_lockstep_repeats_an_all_at_once_run(db):
    """Equal lengths, C clients, prefill steps that run alone (SGLang): every cycle is an all-at-once run of C.
    An engine that mixes decode into prefill steps (vLLM) keeps the steady state of desynchronised clients."""
    common = {"n_gpus": 8, "weight_format": "fp8", "prompt_tokens": 3200, "output_tokens": 800}
    loop = estimate("deepseek-v3", "h200", engine="SGLang", concurrency=64, **common)
    burst = estimate("deepseek-v3", "h200", engine="SGLang", num_requests=64, **common)
    assert loop.ttft_s == pytest.approx(burst.ttft_s) and loop.itl_s == pytest.approx(burst.itl_s)
    assert loop.throughput_out_tps == pytest.approx(burst.throughput_out_tps)
    assert loop.request_rate * loop.e2e_latency_s == pytest.approx(64)   # Little: C = X · E2E, no client idles
    r = loop.results
    assert r["ttft_p50_s"] <= r["ttft_p90_s"] <= r["ttft_p99_s"] and r["itl_p50_s"] <= r["itl_p99_s"]
    mixed = estimate("deepseek-v3", "h200", engine="vLLM", concurrency=64, **common)
    assert mixed.ttft_s < 0.2 * loop.ttft_s
    # a request mix breaks the lockstep: the steady state again
    assert estimate("deepseek-v3", "h200", engine="SGLang", concurrency=64, lengths="chat", n_gpus=8,
                    weight_format="fp8").ttft_s < 0.2 * loop.ttft_s


def test_a_published_closed_loop_in_lockstep():
    """dstack's DeepSeek-R1 runs on 8 MI300X (SGLang 0.4.2, 3,200 prompt and 800 output tokens, 500 prompts):
    the mean TTFT grows 11.1x from 8 to 128 clients (2.46 s to 27.3 s), as the prompts of a whole wave queue
    before anyone's first token. The lockstep gives the growth within 25%; desynchronised clients gave ~1.5x."""
    rows = {r["id"]: r for r in csv.DictReader((ROOT / "measurements_db" / "datacenter-2025.csv")
                                               .open(encoding="utf-8"))}
    pair = [rows[f"dstack-dsr1-mi300x-sglang-c{c}-o800-ttft"] for c in (8, 128)]
    measured = float(pair[1]["value"]) / float(pair[0]["value"])
    few, many = (float(r["predicted"]) for r in predict_rows(pair))
    assert measured == pytest.approx(11.1, rel=0.01)
    assert many / few == pytest.approx(measured, rel=0.25)


def test_a_release_that_prefills_alone_runs_its_closed_loops_in_lockstep():
    """dstack's DeepSeek-R1 runs on 8 MI300X under vLLM 0.7.3 (the V0 engine, which schedules prompts in steps of
    their own before any decode): the mean TTFT grows 9.7x from 4 to 64 clients (1.26 s to 12.2 s), a wave of
    prompts at a time. The row's release selects V0's scheduling and its lockstep gives that growth within 25%;
    the same rows read as a current (V1) release, whose steps mix prompts into the decode, wait behind a wave of
    prompts only in each run's first C of its 500 requests (tests/test_first_wave.py): they grow about half as
    much."""
    rows = {r["id"]: r for r in csv.DictReader((ROOT / "measurements_db" / "datacenter-2025.csv")
                                               .open(encoding="utf-8"))}
    pair = [rows[f"dstack-dsr1-mi300x-vllm-c{c}-o800-ttft"] for c in (4, 64)]
    assert all(r["engine_version"].startswith("0.7.3") for r in pair)
    measured = float(pair[1]["value"]) / float(pair[0]["value"])
    assert measured == pytest.approx(9.7, rel=0.01)
    few, many = (float(r["predicted"]) for r in predict_rows(pair))
    assert many / few == pytest.approx(measured, rel=0.25)
    current = [{**r, "engine_version": "0.11.0"} for r in pair]
    few_v1, many_v1 = (float(r["predicted"]) for r in predict_rows(current))
    assert many_v1 / few_v1 < 0.6 * many / few and few_v1 < few


def test_an_engine_release_selects_only_its_scheduling():
    """vLLM before 0.8.0 (V0) prefills whole prompts in steps of their own, each launched from Python (its CUDA graphs
    are for decode steps); 0.8.0 and later schedule as the profile's V1, and 0.10.0 and later, an unstated release
    and a container tag without a release number keep all of the profile's properties."""
    from estimator.efficiency.engine_profiles import engine, release_of
    vllm = engine("vLLM")
    assert release_of("0.7.3.dev138+g21f6ca217") == (0, 7, 3) and release_of("NGC 25.09") is None
    assert dict(vllm.scheduling_at("0.7.4.dev181+gf35f8e22")) == {"prefill_runs_alone": True,
                                                                  "prefill_chunk_tokens": None,
                                                                  "graphed_prefill_tokens": 0,
                                                                  "sampler_warmup_bytes_per_logit": 0.0}
    assert engine("vLLM@rocm").scheduling_at("v0.6.6") == vllm.scheduling_at("0.7.3")
    for current in ("0.10.0", "0.11.0", "", "NGC 25.09"):
        assert vllm.scheduling_at(current) == ()
    # 0.8-0.9 schedule as V1 but sized their cache without the sampler warm-up's reserve (test_engine_memory.py)
    assert dict(vllm.scheduling_at("0.8.5")) == {"sampler_warmup_bytes_per_logit": 0.0}
    assert not vllm.parameters.prefill_runs_alone and vllm.parameters.prefill_chunk_tokens == 8192
    released = engine("vllm@0.7.3")                       # --engine vLLM@0.7.3: the efficiencies stay the profile's
    assert released.name == "vLLM@0.7.3" and released.parameters.prefill_runs_alone
    assert released.parameters.model_copy(update={"prefill_runs_alone": False, "prefill_chunk_tokens": 8192,
                                                  "graphed_prefill_tokens": 512,
                                                  "sampler_warmup_bytes_per_logit": 38.7}) == vllm.parameters
    assert engine("vllm@v0").parameters == released.parameters and engine("vllm@v1").parameters == vllm.parameters


def test_vllm_before_0_6_processes_outputs_between_steps():
    """Before 0.6.0 vLLM's V0 engine processed a step's outputs before it scheduled the next one, the GPU idle: RFC
    #6913 timed that at 0.2 ms a step with 1 sequence and 3.4 ms with 32, (3.4 - 0.2) / 31 = 103 us a sequence. A
    decode step of 32 sequences on 0.5.4 is 32 x 103 us = 3.296 ms longer than on 0.7.3 (V0 scheduled alike, its
    outputs processed beside the next step); 0.6.0 and later releases pay none of it."""
    from estimator.efficiency.engine_profiles import engine
    from estimator.evaluation.api import estimate
    vllm = engine("vLLM")
    assert vllm.runtime_of("0.5.4") == "v0-sync" and vllm.runtime_of("0.6.0") == vllm.runtime_of("0.7.3") == "v0"
    assert engine("vllm@0.5.4").parameters.blocking_output_per_sequence_s == pytest.approx(103e-6)
    assert engine("vllm@0.6.0").parameters.blocking_output_per_sequence_s == vllm.parameters.blocking_output_per_sequence_s == 0
    itl = {(version, batch): estimate("llama-3.1-8b", "H100 SXM", engine=f"vLLM@{version}", batch=batch,
                                      prompt_tokens=128, output_tokens=64).to_dict()["itl_s"]
           for version in ("0.5.4", "0.7.3") for batch in (1, 32)}
    assert itl["0.5.4", 32] - itl["0.7.3", 32] == pytest.approx(32 * 103e-6, rel=1e-6)
    assert itl["0.5.4", 1] - itl["0.7.3", 1] == pytest.approx(103e-6, rel=1e-6)
    # at 256 sequences the step is overhead-bound, and the report says how much of it the outputs take
    from estimator.reporting.estimate_text import format_estimate
    text = format_estimate(estimate("llama-3.1-8b", "H100 SXM", engine="vLLM@0.5.4", batch=256))
    assert "decode step of 256 sequences: overhead-bound" in text and "26.37 ms of it is processing the step's outputs" in text
    assert "processing the step's outputs" not in format_estimate(estimate("llama-3.1-8b", "H100 SXM",
                                                                           engine="vLLM@0.7.3", batch=256))


def test_a_stated_runtime_overrides_the_releases_default():
    """TensorRT-LLM ran built TensorRT engines by default before 1.0 and its PyTorch backend from 1.0 (PR #5312); a
    run that states its runtime (0.19's perf overview: "PyTorch backend") is predicted on it whatever its release,
    and a runtime the engine does not have is the row's error, naming the ones it has."""
    from estimator.efficiency.engine_profiles import engine
    trt = engine("TensorRT-LLM")
    assert trt.runtime_of("0.17") == "tensorrt" and trt.runtime_of("1.0.0rc4") == trt.runtime_of("") == "pytorch"
    assert trt.runtime_of("0.19.0", "PyTorch") == "pytorch" and trt.runtime_of("1.2", "tensorrt") == "tensorrt"
    assert dict(trt.scheduling_at("0.9.0")) == {"graphed_prefill_tokens": None} and trt.scheduling_at("1.2.0rc1") == ()
    assert trt.parameters.graphed_prefill_tokens == 0 and engine("trtllm@0.16").parameters.graphed_prefill_tokens is None
    with pytest.raises(UnknownNameError, match="unknown runtime 'v0' for TensorRT-LLM: known pytorch, tensorrt"):
        trt.runtime_of("1.0", "v0")
    with pytest.raises(UnknownNameError, match=r"or a runtime \(pytorch, tensorrt\)"):
        engine("trtllm@turbo")
    row = {"id": "r", "hardware": "h200", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "fp8",
           "batch": "1", "input_len": "2048", "output_len": "1", "metric": "ttft_ms", "engine": "TensorRT-LLM",
           "engine_version": "0.19.0"}
    built, stated, bad = predict_rows([row, {**row, "runtime": "pytorch"}, {**row, "runtime": "v0"}])
    assert built["status"] == stated["status"] == "ok" and float(stated["predicted"]) >= float(built["predicted"])
    assert bad["status"] == "invalid" and "known pytorch, tensorrt" in bad["reason"]


def test_a_release_must_name_a_runtime_the_profile_lists():
    from estimator.efficiency.engine_profiles import EngineProfile, engine
    doc = engine("TensorRT-LLM").model_dump()
    doc["releases"][0]["runtime"] = "v0"
    with pytest.raises(ValidationError, match="releases name runtimes the profile does not list"):
        EngineProfile.model_validate(doc)
    with pytest.raises(ValidationError, match="names its own"):
        EngineProfile.model_validate({**engine("TensorRT-LLM").model_dump(), "runtime": None})


def test_an_estimate_of_a_v0_release_under_a_closed_loop_is_in_lockstep(db):
    """`roofline estimate --engine vLLM@0.7.3 --concurrency 64`: each cycle is the all-at-once run of 64."""
    common = {"n_gpus": 8, "weight_format": "fp8", "prompt_tokens": 3200, "output_tokens": 800}
    loop = estimate("deepseek-v3", "h200", engine="vLLM@0.7.3", concurrency=64, **common)
    burst = estimate("deepseek-v3", "h200", engine="vLLM@0.7.3", num_requests=64, **common)
    assert loop.ttft_s == pytest.approx(burst.ttft_s) and loop.itl_s == pytest.approx(burst.itl_s)
    assert estimate("deepseek-v3", "h200", engine="vLLM", concurrency=64, **common).ttft_s < 0.2 * loop.ttft_s


def test_an_all_at_once_run_of_a_length_mix(db, tmp_path):
    """vllm bench serve on a dataset of varied lengths (--lengths with --num-requests): a file of identical
    requests is the fixed-length run exactly; a wide mix with the same means fits fewer sequences (the tail of
    its lengths must fit) and so takes longer, before and beyond the running limit."""
    def write(name, rows):
        path = tmp_path / name
        path.write_text("prompt,output\n" + "".join(f"{p},{o}\n" for p, o in rows))
        return str(path)

    same = write("same.csv", [(2000, 300)] * 4)
    wide = write("wide.csv", [(200, 30), (3800, 570)] * 2)
    for n in (16, 2000):
        fixed = estimate("llama-3.1-8b", "h100", engine="vLLM", num_requests=n, prompt_tokens=2000, output_tokens=300)
        alike = estimate("llama-3.1-8b", "h100", engine="vLLM", num_requests=n, lengths=same)
        for key in ("ttft_s", "itl_s", "e2e_latency_s", "throughput_out_tps", "ttft_p90_s", "itl_p99_s"):
            assert alike.results[key] == pytest.approx(fixed.results[key], rel=1e-9), (n, key)
        spread = estimate("llama-3.1-8b", "h100", engine="vLLM", num_requests=n, lengths=wide)
        assert spread.prompt_tokens == 2000 and spread.output_tokens == 300
        assert spread.results["max_running_sequences"] < fixed.results["max_running_sequences"]
        if n > fixed.results["max_running_sequences"]:
            assert spread.throughput_out_tps < fixed.throughput_out_tps
