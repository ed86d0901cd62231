"""Request-length mixes: files and presets, what they change under load, and the queue against a simulation.

Measured agreement of the model with the simulation for a lognormal mix (prompt median 800 tokens,
σ 0.9; output median 100, σ 0.7; seed 0, 20,000 requests), model ÷ simulation − 1 at 30 / 60 / 85%
of the highest rate: TTFT p50 −15 / −32 / −13%, p90 +12 / +3 / −16%, p99 +8 / −2 / −7%, mean TTFT
+1 / +2 / +1%; ITL p50 0 / −2 / −17%, p90 −31 / +36 / +13% (the p90 sits where a tenth of the gaps
carry a stall, a step of the distribution), p99 −1 / −20 / −32%; E2E p99 +1 / +3 / −9%.
"""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from estimator import estimate
from estimator.errors import ConfigurationError
from estimator.serving.continuous_batching import steady_state
from estimator.serving.lengths import batch_that_fits, length_mix, load_presets, preset, request_spread
from estimator.serving.simulation import percentiles, simulate
from tests.helpers import cli

RNG = np.random.default_rng(3)
PROMPTS = np.maximum(np.round(RNG.lognormal(np.log(800), 0.9, 400)), 1)
OUTPUTS = np.maximum(np.round(RNG.lognormal(np.log(100), 0.7, 400)), 2)
PREFILLS = 0.002 + 20e-6 * PROMPTS


def itl(n):
    return 0.010 + 0.00002 * np.asarray(n, dtype=float)


def _write(path, rows) -> str:
    path.write_text("prompt,output\n" + "".join(f"{p:.0f},{o:.0f}\n" for p, o in rows))
    return str(path)


def test_a_file_of_identical_requests_is_the_fixed_length_estimate(tmp_path, db):
    mix = _write(tmp_path / "same.csv", [(2000, 300)] * 5)
    fixed = estimate("llama-3.1-8b", "h100", concurrency=48, prompt_tokens=2000, output_tokens=300)
    mixed = estimate("llama-3.1-8b", "h100", concurrency=48, lengths=mix)
    for key in ("ttft_s", "itl_s", "throughput_out_tps", "ttft_p99_s", "itl_p90_s", "e2e_p99_s", "max_batch"):
        assert mixed.results[key] == pytest.approx(fixed.results[key], rel=1e-9), key


def test_a_spread_of_lengths_lowers_capacity_and_raises_the_tails(tmp_path, db):
    """At the same arrival rate (a closed loop would serve the wide mix fewer requests a second, its long
    requests holding the batch, and so queue its prompts less)."""
    narrow = _write(tmp_path / "narrow.csv", [(1900, 290), (2100, 310)] * 3)
    wide = _write(tmp_path / "wide.csv", [(200, 30), (3800, 570)] * 3)
    a, b = (estimate("llama-3.1-8b", "h100", rate=4.0, lengths=m) for m in (narrow, wide))
    assert a.prompt_tokens == b.prompt_tokens == 2000 and a.output_tokens == b.output_tokens == 300
    assert b.max_batch < a.max_batch
    assert b.ttft_p99_s > a.ttft_p99_s and b.e2e_p99_s > a.e2e_p99_s


def test_the_batch_that_fits_by_hand():
    # capacity 100 sequences of 1,000 tokens; σ = 500: N + 2.326·√N·0.5 <= 100 gives N = 89
    assert float(batch_that_fits(100.0, 1000.0, 500.0)) == 89
    assert float(batch_that_fits(100.0, 1000.0, 0.0)) == 100


def test_decode_lengths_are_length_biased():
    """A batch holds each request for its O steps: long outputs weigh more than their share of requests."""
    from estimator.serving.lengths import LengthMix
    mix = LengthMix(np.array([100.0, 1000.0]), np.array([10.0, 90.0]))
    prompt, output = mix.decode_lengths()
    # E[O (P + O/2)] / E[O] = (10·105 + 90·1045) / 100 = 951; E[O (P + O)] / E[O] = (10·110 + 90·1090) / 100 = 992
    assert prompt + output / 2 == pytest.approx(951.0) and prompt + output == pytest.approx(992.0)


@pytest.mark.parametrize("load", [0.3, 0.6, 0.85])
def test_the_queue_with_a_mix_agrees_with_the_simulation(load):
    spread = request_spread(PREFILLS, OUTPUTS)
    rate = load / (PREFILLS.mean() + (OUTPUTS.mean() - 1) * 0.00002)
    run = simulate(itl, PREFILLS, PROMPTS, OUTPUTS, rate=rate, requests=20_000, seed=0, max_wall_s=30)
    assert not run["truncated"]
    sim = percentiles(run)
    state = steady_state(itl, np.array(spread["prefill_s"]), np.array(PROMPTS.mean()), OUTPUTS.mean(), 0.0, rate,
                         np.array(1e6), 0.0, prefill_scv=spread["scv"])
    model = {f"ttft_{q}_s": float(state[f"ttft_{q}_s"] + spread[f"prefill_{q}_shift_s"]) for q in ("p90", "p99")}
    model["e2e_p99_s"] = float(state["e2e_p99_s"] + spread["prefill_p99_shift_s"]
                               + spread["output_p99_extra"] * state["itl_s"])
    for key, tolerance in (("ttft_p90_s", 0.20), ("ttft_p99_s", 0.15), ("e2e_p99_s", 0.15)):
        assert model[key] == pytest.approx(sim[key], rel=tolerance), key
    assert float(state["ttft_s"]) == pytest.approx(np.mean(run["ttft_s"]), rel=0.05)
    assert float(state["itl_p99_s"]) == pytest.approx(sim["itl_p99_s"], rel=0.35)


@pytest.mark.parametrize("content, message", [
    ("prompt;output\n1;2\n", "columns prompt,output"),
    ("prompt,output\n", "no request with an output token"),
    ("prompt,output\n100,0\n", "no request with an output token"),   # outputs of 0 alone: nothing to time
    ("prompt,output\n100,-1\n", "line 2: output must be a whole number of tokens from 0"),
    ("prompt,output\n100,2.5\n", "line 2: output must be a whole number"),
    ("prompt,output\n100,20\n0,20\n", "line 3: prompt must be a whole number"),
    ("prompt,output\nnan,20\n", "line 2: prompt"),
])
def test_a_malformed_lengths_file_is_named(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(ConfigurationError, match=message):
        length_mix(str(path))


def test_lengths_on_the_command_line(capsys, tmp_path):
    mix = _write(tmp_path / "mix.csv", [(500, 100), (4000, 400)])
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--lengths", mix)
    assert code == 2 and "add --concurrency, --rate or --num-requests" in err and len(err.splitlines()) == 1
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--lengths", mix,
                         "--concurrency", "8", "--prompt", "100")
    assert code == 2 and "--prompt" in err and "drop them" in err
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--lengths", mix,
                         "--concurrency", "8")
    assert code == 0 and "request lengths from " in out and "mix.csv (mean prompt 2,250 tokens" in out
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--lengths", "nonsense",
                       "--concurrency", "8")
    assert code == 2 and "not a CSV file or a preset" in err and "Traceback" not in err


LOGNORMAL_PRESETS = sorted(name for name, entry in load_presets().items() if "high" not in entry["prompt"])


def test_the_presets_hold_both_kinds():
    """Four or more lognormal presets and the uniform draw of bench_serving's random dataset."""
    assert len(LOGNORMAL_PRESETS) >= 4 and set(load_presets()) - set(LOGNORMAL_PRESETS) == {"random"}


@pytest.mark.parametrize("name", LOGNORMAL_PRESETS)
def test_presets_keep_their_published_statistics(name):
    """The bins' means keep a published mean exactly; the median and an upper percentile within a bin."""
    mix = preset(name)
    for key, samples in (("prompt", mix.prompt_tokens), ("output", mix.output_tokens)):
        published = load_presets()[name][key]
        assert np.median(samples) == pytest.approx(published["median"], rel=0.1), key
        if "mean" in published:
            assert samples.mean() == pytest.approx(published["mean"], rel=0.01), key
        else:
            p, value = next((q, published[k]) for k, q in (("p90", 0.9), ("p99", 0.99)) if k in published)
            assert np.quantile(samples, p) == pytest.approx(value, rel=0.15), key


def test_the_random_preset_is_bench_servings_uniform_draw():
    """`random` is what SGLang's bench_serving draws for --dataset-name random at its default range ratio 0: whole
    tokens uniform from 1 (prompts) or 0 (outputs) to the set length. The bins keep the draw's mean and spread, and
    at a run's means (``random@610/421``) they are the draw of the set lengths that gives those means."""
    rng = np.random.default_rng(0)
    mix = preset("random")
    for samples, low in ((mix.prompt_tokens, 1), (mix.output_tokens, 0)):
        drawn = rng.integers(low, 1024 + 1, 200_000)
        assert samples.mean() == pytest.approx(drawn.mean(), rel=0.01)
        assert samples.std() == pytest.approx(drawn.std(), rel=0.02)
        assert 1 <= samples.min() and samples.max() <= 1024
    scaled = length_mix("random@610/421")
    assert scaled.mean_prompt_tokens == pytest.approx(610, rel=0.01)
    assert scaled.mean_output_tokens == pytest.approx(421, rel=0.01)
    # uniform from (nearly) zero to twice the mean, as a set length of 842 tokens draws
    assert scaled.output_tokens.max() == pytest.approx(842 * (1 - 0.5 / 24), rel=0.01)


@pytest.mark.parametrize("ratio, low", [(0.5, 512), (0.8, 819)])
def test_random_at_a_range_ratio_draws_from_its_share_of_the_set_length(ratio, low):
    """`random-rR`: bench_serving's draw at --random-range-ratio R, from int(R L) to L (InferenceX passes 0.8), taken
    at a run's means like any preset; a name that looks like a file suffix is still the preset, and a ratio of 1
    or more (every request at the set lengths: give --prompt and --output) is refused with the presets named."""
    from estimator.validation.predict import predict_rows
    rng = np.random.default_rng(1)
    mix = length_mix(f"random-r{ratio}")
    for samples in (mix.prompt_tokens, mix.output_tokens):
        drawn = rng.integers(low, 1024 + 1, 200_000)
        assert samples.mean() == pytest.approx(drawn.mean(), rel=0.005)
        assert samples.std() == pytest.approx(drawn.std(), rel=0.02)
        assert low <= samples.min() and samples.max() <= 1024
    scaled = length_mix(f"random-r{ratio}@921.5/300")
    assert scaled.mean_prompt_tokens == pytest.approx(921.5, rel=0.01)
    assert scaled.mean_output_tokens == pytest.approx(300, rel=0.01)
    assert scaled.prompt_tokens.min() / scaled.prompt_tokens.max() > ratio - 0.02
    with pytest.raises(ConfigurationError, match=r"random-rR \(a range ratio R from 0 to below 1\)"):
        length_mix("random-r1")
    row = {"id": "x", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "bf16",
           "batch": "", "input_len": "921.5", "output_len": "921.5", "metric": "ttft_ms", "engine": "vLLM",
           "concurrency": "16", "lengths": f"random-r{ratio}"}
    assert predict_rows([row])[0]["status"] == "ok"


def test_a_closed_loop_of_random_lengths_does_not_run_in_lockstep(db):
    """A closed loop of equal requests on SGLang runs in lockstep (all C prefilled together each cycle); the same
    loop drawing bench_serving's random lengths desynchronises, so its TTFT at 64 clients is about one prompt's
    wait, well below the lockstep's prefill of 64 prompts at once."""
    kwargs = dict(engine="SGLang", concurrency=64, db=db)
    equal = estimate("llama-3.1-8b", "h100", prompt_tokens=4000, output_tokens=500, **kwargs)
    drawn = estimate("llama-3.1-8b", "h100", lengths="random@4000/500", **kwargs)
    assert drawn.prompt_tokens == pytest.approx(4000, rel=0.01)
    assert drawn.results["ttft_s"] < 0.5 * equal.results["ttft_s"], (drawn.results["ttft_s"], equal.results["ttft_s"])


def test_a_preset_at_other_means():
    """``sharegpt@229/217``: ShareGPT's shape (its lognormal spreads) at a benchmark's stated mean lengths."""
    base, scaled = preset("sharegpt"), length_mix("sharegpt@229/217")
    assert scaled.mean_prompt_tokens == pytest.approx(229, rel=0.01)
    assert scaled.mean_output_tokens == pytest.approx(217, rel=0.01)
    for a, b in ((base.prompt_tokens, scaled.prompt_tokens), (base.output_tokens, scaled.output_tokens)):
        assert np.std(np.log(b)) == pytest.approx(np.std(np.log(a)), rel=0.05)   # rounding to whole tokens
    with pytest.raises(ConfigurationError, match="not a CSV file or a preset"):
        length_mix("nosuch@200/100")


def test_a_row_names_the_dataset_its_requests_came_from():
    """A `lengths` column takes the preset's shape at the row's means; a name that is no preset is refused."""
    from estimator.validation.predict import predict_rows
    row = {"id": "x", "hardware": "h100", "n_gpus": "1", "model": "qwen3-32b", "weight_format": "bf16",
           "batch": "", "input_len": "217", "output_len": "201", "metric": "throughput_out_tps", "engine": "vLLM",
           "num_requests": "1000"}
    fixed, shaped, wrong = predict_rows([row, {**row, "lengths": "sharegpt"}, {**row, "lengths": "sharegpt_v3"}])
    assert float(shaped["predicted"]) < float(fixed["predicted"])   # the tail of the lengths runs fewer at once
    assert wrong["status"] != "ok" and "'lengths' must name a length preset" in wrong["reason"]


def test_the_benchmark_sharegpt_preset_is_its_published_sample():
    """`sharegpt-bench` (what vllm bench serve and SGLang's bench_serving draw from ShareGPT) comes from the
    per-request lengths of LambdaLabs' 320-prompt vLLM run, kept in measurements_db/lengths/: the preset's
    statistics are that file's, and its replies spread far wider than the `sharegpt` preset's."""
    from importlib import resources
    path = resources.files("measurements_db").joinpath(
        "lengths/lambdalabs-1xh100-80gb-sxm-mistral-7b-instruct-v0.3_tp1_len2000-p320.csv")
    rows = np.loadtxt(io.StringIO(path.read_text()), delimiter=",", skiprows=1)
    published = load_presets()["sharegpt-bench"]
    for column, key in ((0, "prompt"), (1, "output")):
        assert rows[:, column].mean() == pytest.approx(published[key]["mean"], abs=0.05)
        assert np.median(rows[:, column]) == pytest.approx(published[key]["median"])
        for q in ("p90", "p99"):
            assert np.percentile(rows[:, column], float(q[1:])) == pytest.approx(published[key][q], abs=0.05)
    bench, papers = preset("sharegpt-bench"), preset("sharegpt")
    assert np.std(np.log(bench.output_tokens)) > 2 * np.std(np.log(papers.output_tokens))


def test_a_row_may_cite_its_runs_own_lengths_file(tmp_path):
    """A `predict` row's `lengths` may name a CSV of its run's requests, read beside the CSV that holds the row;
    a missing one is that row's error, naming the column, and the other rows still run."""
    from estimator.validation.predict import predict_file
    (tmp_path / "mine.csv").write_text("prompt,output\n100,50\n200,0\n300,400\n")
    row = ("h100,1,llama-3.1-8b,bf16,,200,150,throughput_out_tps,vLLM,3")
    (tmp_path / "rows.csv").write_text("id,hardware,n_gpus,model,weight_format,batch,input_len,output_len,metric,"
                                       f"engine,num_requests,lengths\na,{row},mine.csv\nb,{row},missing.csv\n"
                                       f"c,{row},\n")
    predict_file(str(tmp_path / "rows.csv"), str(tmp_path / "out.csv"))
    with (tmp_path / "out.csv").open(newline="") as fh:
        own, missing, mean_only = csv.DictReader(fh)
    assert own["status"] == mean_only["status"] == "ok"
    assert float(own["predicted"]) < float(mean_only["predicted"])   # the 400-token reply ends the run
    assert missing["status"] == "invalid" and "column 'lengths'" in missing["reason"]
    assert "missing.csv" in missing["reason"] and "Error" not in missing["reason"]
