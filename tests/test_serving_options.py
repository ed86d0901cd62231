"""The scheduler's cap on running sequences, prefix-cache hits, and the layouts and lengths `predict` accepts."""

import csv
import json
import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest

from estimator import estimate
from estimator.efficiency.engine_profiles import engine
from estimator.errors import ConfigurationError
from estimator.validation.predict import predict_rows
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[1]

COMMON = dict(prompt_tokens=1024, output_tokens=256)


def test_requests_beyond_the_cap_wait_for_a_slot(db):
    """Closed loop past max_num_seqs: throughput holds, the extra clients queue, and Little's law still holds."""
    at_cap = estimate("llama-3.1-8b", "h100", concurrency=64, max_num_seqs=64, **COMMON)
    beyond = estimate("llama-3.1-8b", "h100", concurrency=160, max_num_seqs=64, **COMMON)
    assert not beyond.saturated and beyond.queued_requests == 96 and beyond.max_running_sequences == 64
    assert beyond.throughput_out_tps == pytest.approx(at_cap.throughput_out_tps, rel=0.01)
    assert beyond.ttft_s == pytest.approx(at_cap.ttft_s + 96 / beyond.request_rate, rel=0.02)
    # every client is either waiting or being served: C = X · (wait + service)
    assert beyond.request_rate * beyond.e2e_latency_s == pytest.approx(160, rel=0.02)
    for q in ("p50", "p90", "p99"):
        assert beyond.results[f"ttft_{q}_s"] >= at_cap.results[f"ttft_{q}_s"] + 0.9 * 96 / beyond.request_rate


def test_a_cap_lowers_throughput_and_itl_never_rises(db):
    free = estimate("llama-3.1-8b", "h100", concurrency=200, **COMMON)
    capped = estimate("llama-3.1-8b", "h100", concurrency=200, max_num_seqs=32, **COMMON)
    assert capped.steady_batch <= 32 < free.steady_batch
    assert capped.itl_s < free.itl_s and capped.throughput_out_tps < free.throughput_out_tps
    assert capped.ttft_s > free.ttft_s


def test_an_open_loop_beyond_the_cap_saturates(db):
    capped = estimate("llama-3.1-8b", "h100", rate=1.0, max_num_seqs=4, **COMMON)
    assert capped.max_rate < estimate("llama-3.1-8b", "h100", rate=1.0, **COMMON).max_rate
    over = estimate("llama-3.1-8b", "h100", rate=2 * capped.max_rate, max_num_seqs=4, **COMMON)
    assert over.saturated and over.to_dict()["ttft_p99_s"] is None


def test_vllm_caps_by_device_as_its_source_says(db):
    """vLLM: 1024 sequences on a 70+ GiB device that is not an A100, 256 elsewhere; no cap for a generic engine."""
    vllm = engine("vllm").scheduler
    assert vllm.max_num_seqs_on(db.hardware.get("h100")) == 1024
    assert vllm.max_num_seqs_on(db.hardware.get("a100 80gb sxm")) == 256
    assert vllm.max_num_seqs_on(db.hardware.get("l40s")) == 256
    assert engine("generic").scheduler is None
    small = dict(prompt_tokens=128, output_tokens=128, concurrency=2000)
    on_h100 = estimate("llama-3.2-1b", "h100", engine="vllm", **small)
    on_a100 = estimate("llama-3.2-1b", "a100 80gb sxm", engine="vllm", **small)
    assert on_h100.max_running_sequences == 1024 and on_a100.max_running_sequences == 256
    assert estimate("llama-3.2-1b", "h100", **small).max_running_sequences > 1024   # the KV cache alone


def test_vllm_v0_releases_cap_at_256_on_every_device(db):
    """V0 (releases before 0.8.0) ran at most 256 sequences when the user set no cap, on any device; V1's larger
    default is for large devices (engines_db/vllm.yaml, runtimes.v0.scheduler). A release's row takes its own."""
    h100 = db.hardware.get("h100")
    assert engine("vLLM@0.7.3").scheduler.max_num_seqs_on(h100) == 256
    assert engine("vLLM@v0").scheduler.max_num_seqs_on(h100) == 256
    assert engine("vLLM").scheduler.max_num_seqs_on(h100) == engine("vLLM@0.9.0").scheduler.max_num_seqs_on(h100) == 1024
    burst = {**ROW, "model": "meta-llama/Llama-3.2-1B", "metric": "throughput_out_tps", "input_len": "80",
             "output_len": "60", "num_requests": "1024"}
    old, new = predict_rows([{**burst, "engine_version": "0.6.3"}, {**burst, "id": "n", "engine_version": "0.11.0"}],
                            db)
    assert "the engine runs at most 256" in old["reason"] and "the engine runs at most 1024" in new["reason"]
    assert float(old["predicted"]) < float(new["predicted"])


def test_max_num_seqs_needs_a_load(capsys):
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--max-num-seqs", "8")
    assert code == 2 and "add --concurrency, --rate or --num-requests" in err and len(err.splitlines()) == 1 and not out
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--concurrency", "300",
                         "--max-num-seqs", "100")
    assert code == 0 and "at most 100 sequences run at once, 200 waiting for a slot" in out


@pytest.mark.parametrize("value", ["-0.1", "1.5", "nan", "x"])
def test_a_hit_rate_outside_zero_to_one_is_refused(capsys, value):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--prefix-hit-rate", value)
    assert code == 2 and "--prefix-hit-rate" in err and "from 0 to 1" in err and "Traceback" not in err


def test_prefix_hits_skip_prefill_but_not_attention(db):
    cold = estimate("llama-3.1-8b", "h100", prompt_tokens=4096)
    warm = estimate("llama-3.1-8b", "h100", prompt_tokens=4096, prefix_hit_rate=0.75)
    full = estimate("llama-3.1-8b", "h100", prompt_tokens=4096, prefix_hit_rate=1.0)
    assert warm.prefill_flops_linear == pytest.approx(cold.prefill_flops_linear / 4)
    # the new quarter attends to the whole prompt: more than a quarter of the attention pairs
    assert cold.prefill_flops_attention / 4 < warm.prefill_flops_attention < cold.prefill_flops_attention
    assert full.cached_tokens == 4095 and full.ttft_s > 0     # the last token is always computed
    assert warm.memory_kv_cache_bytes == cold.memory_kv_cache_bytes   # hits stay in the sequence's cache


def test_more_hits_never_raise_ttft_below_saturation(db):
    for load in (dict(concurrency=32), dict(rate=2.0)):
        ttft = [estimate("llama-3.1-8b", "h100", prompt_tokens=8192, output_tokens=256, prefix_hit_rate=h,
                         **load) for h in np.linspace(0, 0.95, 6)]
        assert all(not e.saturated for e in ttft)
        for q in ("ttft_s", "ttft_p50_s", "ttft_p99_s"):
            values = [e.results[q] for e in ttft]
            assert np.all(np.diff(values) <= 1e-12), (load, q, values)


ROW = {"id": "r", "hardware": "NVIDIA H100 SXM", "n_gpus": "1", "model": "meta-llama/Llama-3.1-8B-Instruct",
       "weight_format": "bf16", "batch": "", "input_len": "1024", "output_len": "256", "metric": "ttft_ms",
       "engine": "vLLM"}


def test_predict_reads_the_cap_and_the_hit_rate(db):
    base, capped, hits, bad = predict_rows([
        {**ROW, "concurrency": "300"}, {**ROW, "id": "c", "concurrency": "300", "max_num_seqs": "32"},
        {**ROW, "id": "h", "concurrency": "32", "prefix_hit_rate": "0.9"},
        {**ROW, "id": "b", "concurrency": "32", "prefix_hit_rate": "1.2"}], db)
    assert base["status"] == capped["status"] == hits["status"] == "ok"
    assert float(capped["predicted"]) > 2 * float(base["predicted"])
    assert float(hits["predicted"]) < float(predict_rows([{**ROW, "concurrency": "32"}], db)[0]["predicted"])
    assert bad["status"] == "invalid" and "'prefix_hit_rate'" in bad["reason"] and "from 0 to 1" in bad["reason"]


@pytest.mark.parametrize("column, value, accepted", [("concurrency", "0", ">= 1"), ("concurrency", "2.5", "whole"),
                                                     ("request_rate", "0", "> 0"), ("request_rate", "inf", ">= 0"),
                                                     ("max_num_seqs", "0", ">= 1"), ("num_requests", "0", ">= 1"),
                                                     ("tp", "0", ">= 1"), ("dp", "0", ">= 1"),
                                                     ("gpu_layers", "0", ">= 1")])
def test_a_written_zero_load_is_the_rows_error_not_no_load(db, column, value, accepted):
    """A 0 in a load, cap or count column is refused with the column named, not read as an empty cell (which would
    evaluate the row at the largest batch, as all its requests sent at once, in the default layout or with every layer
    on the device); the other rows still run."""
    load = {} if column in ("concurrency", "request_rate", "num_requests") else {"concurrency": "8"}
    bad, good = predict_rows([{**ROW, **load, column: value}, {**ROW, "id": "g", "concurrency": "8"}], db)
    assert bad["status"] == "invalid" and f"'{column}'" in bad["reason"] and accepted in bad["reason"]
    assert good["status"] == "ok"


def test_predict_lays_out_devices_beyond_a_node(db):
    """64 H100s: TP 8 within each HGX board, 8 replicas; 72 GB200s form one NVL72 domain, TP limited by the heads."""
    row = {**ROW, "model": "meta-llama/Llama-3.1-70B-Instruct", "batch": "64", "metric": "throughput_out_tps",
           "weight_format": "fp8"}
    hgx, nvl, given = predict_rows([{**row, "n_gpus": "64"}, {**row, "id": "g", "n_gpus": "72", "hardware": "GB200"},
                                    {**row, "id": "t", "n_gpus": "64", "tp": "4", "pp": "2", "dp": "8"}], db)
    assert "layout chosen: tp8 pp1 ep1 dp8" in hgx["reason"] and hgx["status"] == "ok"
    assert "tp8 pp1 ep1 dp9" in nvl["reason"]
    assert given["status"] == "ok" and "layout chosen" not in given["reason"]
    wrong = predict_rows([{**row, "n_gpus": "64", "tp": "8", "dp": "4"}], db)[0]
    assert wrong["status"] == "invalid" and "n_gpus must be tp x pp x dp" in wrong["reason"]


def test_predict_takes_fractional_mean_lengths(db):
    whole, mean = predict_rows([{**ROW, "batch": "8"}, {**ROW, "id": "m", "batch": "8", "input_len": "1024.5",
                                                        "output_len": "255.5"}], db)
    assert mean["status"] == "ok" and float(mean["predicted"]) == pytest.approx(float(whole["predicted"]), rel=0.01)
    with pytest.raises(ConfigurationError, match="whole number"):
        estimate("llama-3.1-8b", "h100", prompt_tokens=1024.5)


def test_the_last_step_of_a_long_generation(db):
    """itl_end_s times one step at the full context: a 2-token generation from the same context, nearly."""
    long = estimate("qwen3-32b", "h100", prompt_tokens=1000, output_tokens=32000)
    last = estimate("qwen3-32b", "h100", prompt_tokens=32998, output_tokens=2)   # its one step attends to 33,000
    assert long.itl_end_s == pytest.approx(last.itl_s, rel=1e-4)
    assert long.itl_end_s > long.itl_s > estimate("qwen3-32b", "h100", prompt_tokens=1000, output_tokens=2).itl_s
    loaded = estimate("qwen3-32b", "h100", prompt_tokens=1000, output_tokens=32000, concurrency=2)
    assert loaded.itl_end_s > loaded.itl_s and long.max_batch == loaded.max_batch


def test_a_second_kv_tier_holds_more_prefixes_and_costs_a_copy(db):
    """LMCache-style tier: capacity gained for cached prefixes; hits found there cross the host link or come off a drive."""
    common = dict(n_gpus=2, weight_format="fp8", prompt_tokens=8000, prefix_hit_rate=0.8)
    device_only = estimate("llama-3.1-70b", "h100", **common)
    small, large = (estimate("llama-3.1-70b", "h100", kv_offload="cpu", kv_offload_gib=g, **common) for g in (64, 512))
    disk = estimate("llama-3.1-70b", "h100", kv_offload="disk", kv_offload_gib=512, **common)
    assert device_only.kv_tier_load_s == 0 and device_only.prefix_cache_tokens < small.prefix_cache_tokens \
        < large.prefix_cache_tokens
    per_token = large.kv_cache_bytes_per_token
    assert large.prefix_cache_tokens - small.prefix_cache_tokens == pytest.approx(448 * 2**30 / per_token, rel=0.02)
    # the same hit rate: more of it in the tier, more to copy back; a drive is slower than the host link
    assert 0 < small.kv_tier_load_s < large.kv_tier_load_s < disk.kv_tier_load_s
    assert large.ttft_s == pytest.approx(device_only.ttft_s + large.kv_tier_load_s)
    hits_bytes_per_device = 0.8 * 7999 * per_token / 2   # 80% of the prompt, a device's half of the cache
    assert large.kv_tier_load_s < hits_bytes_per_device / (0.8 * 63e9) * 1.01 + 1e-9   # never beyond the link


@pytest.mark.parametrize("options, message", [
    (dict(kv_offload="cpu"), "both --kv-offload"), (dict(kv_offload_gib=8.0), "both --kv-offload"),
    (dict(kv_offload="disk", kv_offload_gib=8.0), "add --prefix-hit-rate")])
def test_a_kv_tier_needs_its_size_and_hits(options, message, db):
    with pytest.raises(ConfigurationError, match=message):
        estimate("llama-3.1-8b", "h100", **options)


def test_an_offline_row_runs_at_the_engines_cap(db):
    """No batch, no load: the engine runs what its KV cache holds, up to its max_num_seqs."""
    row = {**ROW, "model": "meta-llama/Llama-3.2-1B", "input_len": "128", "output_len": "128",
           "metric": "throughput_out_tps"}
    generic, vllm, stated = predict_rows([{**row, "engine": "generic"}, {**row, "id": "v"},
                                          {**row, "id": "s", "max_num_seqs": "8"}], db)
    batch = [int(r["reason"].rsplit(" ", 1)[1]) for r in (generic, vllm, stated)]
    assert batch[0] > 1024 and batch[1] == 1024 and batch[2] == 8
    assert float(stated["predicted"]) < float(vllm["predicted"])


def test_a_finite_benchmark_beyond_capacity_runs_at_capacity_with_a_backlog(db):
    """--rate above what the engine serves, --num-requests N: no steady state, a backlog that grows with N."""
    common = dict(n_gpus=4, tp=4, prompt_tokens=467, output_tokens=256, engine="TensorRT-LLM")
    endless = estimate("llama-3.1-70b", "h100", rate=32, **common)
    assert endless.saturated
    capacity = endless.max_rate
    few, many = (estimate("llama-3.1-70b", "h100", rate=32, num_requests=n, **common) for n in (500, 5000))
    assert not few.saturated and few.request_rate == pytest.approx(0.999 * capacity, rel=1e-6)
    # output tokens over the run: the last request starts at 499 / X and ends at most one E2E later
    X = 0.999 * capacity
    assert few.throughput_out_tps == pytest.approx(500 * 256 / float(few.results["run_duration_s"]), rel=1e-6)
    assert 499 / X + few.ttft_s < float(few.results["run_duration_s"]) < 499 / X + few.e2e_latency_s
    # a few hundred requests fit in the engine's slots: no wait for a slot; thousands wait
    assert few.backlog_wait_s == 0 and many.backlog_wait_s > 10
    assert many.ttft_s == pytest.approx(few.ttft_s + many.backlog_wait_s)
    assert many.ttft_p50_s < many.ttft_p90_s < many.ttft_p99_s
    below = estimate("llama-3.1-70b", "h100", rate=4, num_requests=5000, **common)
    assert below.backlog_wait_s == 0 and below.ttft_s == estimate("llama-3.1-70b", "h100", rate=4, **common).ttft_s


def test_plan_takes_the_cap(capsys):
    """`roofline plan --max-num-seqs`: a tight cap makes every configuration queue, so fewer pass."""
    common = ["plan", "--model", "llama-3.1-8b", "--gpus", "h100,l40s", "--prompt", "512", "--output", "128",
              "--concurrency", "64", "--max-ttft-s", "1", "--json"]
    code, free, _ = cli(capsys, *common)
    code_capped, capped, _ = cli(capsys, *common, "--max-num-seqs", "4")
    assert code == code_capped == 0
    assert len(json.loads(capped)["configurations"]) < len(json.loads(free)["configurations"])


def test_an_mlperf_style_offline_row_runs(db):
    """8 devices, output tokens/s, fractional mean lengths (made up here), every sample queued at once."""
    row = {"id": "mlperf", "hardware": "NVIDIA H100 SXM", "n_gpus": "8", "model": "meta-llama/Llama-2-70b-hf",
           "weight_format": "fp8", "batch": "", "input_len": "1000.5", "output_len": "300.25",
           "metric": "throughput_out_tps", "engine": "TensorRT-LLM", "num_requests": "24576"}
    out = predict_rows([row], db)[0]
    assert out["status"] == "ok" and float(out["predicted"]) > 0
    assert "layout chosen" not in out["reason"] and "24,576 requests sent at once" in out["reason"]


@pytest.mark.parametrize("engine, on_demand", [("vLLM", True), ("SGLang", True), ("TensorRT-LLM", False)])
def test_an_engine_that_allocates_kv_on_demand_runs_its_sequences_current_lengths(db, engine, on_demand):
    """vLLM and SGLang add KV blocks as tokens come: their cache holds the running sequences' current lengths,
    P + O/2 on average over a decode, where TensorRT-LLM reserves the final P + O. At P = O = 1,000 they run the
    N with N · 1,500 + z √N · 1,000/√12 within the tokens that hold the final-length batch (2,000 each), z = 2.33."""
    lengths = dict(engine=engine, prompt_tokens=1000, output_tokens=1000)
    fits = estimate("llama-3.1-8b", "h100", **lengths).max_batch         # a static batch: its final lengths
    e = estimate("llama-3.1-8b", "h100", rate=1000.0, **lengths)
    running = e.results["max_running_sequences"]
    assert e.max_batch == running and bool(e.results["fits"])
    static = estimate("llama-3.1-8b", "h100", batch=int(running), **lengths).results["memory_kv_cache_bytes"]
    assert e.results["memory_kv_cache_bytes"] == pytest.approx(static * (1500 / 2000 if on_demand else 1.0))
    if not on_demand:
        assert running == fits
        return
    b = NormalDist().inv_cdf(0.99) * 1000 / math.sqrt(12)
    root = (-b + math.sqrt(b * b + 4 * 1500 * 2000 * fits)) / (2 * 1500)
    assert running == math.floor(root ** 2) and 1.25 * fits < running < 4 / 3 * fits


def test_a_published_run_past_the_final_length_capacity(db):
    """io.net's 200 ShareGPT requests at 32 a second to Llama-3-70B on two H100 PCIe (vLLM 0.8.5): a mean TTFT of
    4.14 s, the engine saturated. Capacity counted at the final lengths queued them for 9.8 s; at the current ones
    the engine runs more at once and they wait less. (The memory model puts the weights 0.2 GB per device over
    what vLLM takes, so the row is predicted as if it fit, as a run that ran always is.)"""
    table = (ROOT / "measurements_db" / "thirdparty-datacenter-engines.csv").open(encoding="utf-8")
    rows = [r for r in csv.DictReader(table) if r["id"] == "iog-h100pcie-x2-llama3-70b-qps32-ttft-mean"]
    (result,) = predict_rows(rows, db)
    assert float(result["predicted"]) == pytest.approx(float(rows[0]["value"]), rel=0.3)
