"""Prediction intervals: hierarchical shrinkage by hand, physics caps, and the mechanisms the fit gained."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from estimator import estimate, sweep
from estimator.efficiency.defaults import GENERIC_ENGINE, PHYSICAL_LIMIT
from estimator.efficiency.rates import effective_rates
from estimator.evaluation.intervals import band, band_remark, cell_path, row_interval, shrunk_quantiles
from estimator.reporting.estimate_text import format_estimate
from tests.helpers import run


def test_a_sparse_cell_leans_on_its_parent():
    # regime: q50 = 0 (100 rows from 30 sources); dense models: 80 rows; engine: 10 rows from 10 sources at
    # q50 = 0.4; engine on a group: 2 rows from 2 sources at q50 = 1.0; prior 10 pseudo-sources
    cells = {"decode_b1": [-0.2, 0.0, 0.2, 100, 30], "decode_b1|dense": [-0.2, 0.0, 0.2, 80, 25],
             "decode_b1|dense|vLLM": [0.2, 0.4, 0.6, 10, 10], "decode_b1|dense|vLLM|desktop": [0.8, 1.0, 1.2, 2, 2]}
    q = shrunk_quantiles(cells, cell_path("decode_b1", False, "vLLM", "desktop", "cuda", "16-bit"), prior_sources=10)
    # engine: (10 x 0.4 + 10 x 0.0) / 20 = 0.2; group: (2 x 1.0 + 10 x 0.2) / 12 = 1/3; no format or backend cell
    assert math.isclose(q[1], 1 / 3)
    assert math.isclose(q[0], (2 * 0.8 + 10 * 0.0) / 12)    # engine level: (10 x 0.2 + 10 x -0.2) / 20 = 0
    assert shrunk_quantiles(cells, cell_path("prefill", False, "vLLM", "desktop", "cuda", "16-bit"), 10) is None


def test_a_cell_weighs_its_sources_not_its_rows():
    # 300 rows at q50 = 0.5 from one campaign weigh one source: (1 x 0.5 + 10 x 0) / 11; the same shift spread
    # over ten campaigns weighs ten
    for sources, expected in ((1, 0.5 / 11), (10, 0.5 * 10 / 20)):
        cells = {"prefill": [-0.3, 0.0, 0.3, 1000, 40], "prefill|dense": [-0.3, 0.0, 0.3, 700, 35],
                 "prefill|dense|MLX": [0.3, 0.5, 0.7, 300, sources]}
        q = shrunk_quantiles(cells, cell_path("prefill", False, "MLX", "unified", "metal", "mlx"), 10)
        assert math.isclose(q[1], expected)


def test_a_cell_with_its_parents_rows_adds_nothing():
    # an engine seen on one device group and one backend: its group and backend cells hold the engine's very rows,
    # so reading them must not shrink the band twice more towards the same residuals
    engine = "decode_b1|dense|MLX"
    cells = {"decode_b1": [-0.2, 0.0, 0.2, 500, 30], "decode_b1|dense": [-0.2, 0.0, 0.2, 400, 28],
             engine: [0.2, 0.4, 0.6, 60, 4]}
    deeper = {**cells, f"{engine}|unified": [0.2, 0.4, 0.6, 60, 4], f"{engine}|unified|mlx": [0.2, 0.4, 0.6, 60, 4],
              f"{engine}|unified|mlx|metal": [0.2, 0.4, 0.6, 60, 4]}
    path = cell_path("decode_b1", False, "MLX", "unified", "metal", "mlx")
    assert math.isclose(shrunk_quantiles(cells, path, 10)[1], 4 * 0.4 / 14)
    assert np.allclose(shrunk_quantiles(deeper, path, 10), shrunk_quantiles(cells, path, 10))


def test_moe_models_read_their_own_cells():
    # 30 MoE rows (8 sources) at q50 = 0.5 (predicted 1.65x too fast): an MoE row's median leans to them, a dense
    # row's does not
    cells = {"prefill": [-0.3, 0.1, 0.6, 130, 30], "prefill|dense": [-0.3, 0.0, 0.3, 100, 25],
             "prefill|moe": [0.1, 0.5, 0.9, 30, 8]}
    dense = shrunk_quantiles(cells, cell_path("prefill", False, "llama.cpp", "desktop", "cuda", "gguf k-quant"), 10)
    moe = shrunk_quantiles(cells, cell_path("prefill", True, "llama.cpp", "desktop", "cuda", "gguf k-quant"), 10)
    assert math.isclose(dense[1], (25 * 0.0 + 10 * 0.1) / 35)
    assert math.isclose(moe[1], (8 * 0.5 + 10 * 0.1) / 18)


def test_decode_and_prefill_cells_part_by_format_family():
    # llama.cpp on desktop cards: K-quant rows (6 sources) at q50 = 0.3 under the group's (12 sources) at
    # q50 = 0.1. A K-quant row of decode leans to its family, then to its backend's (5 sources) at q50 = 0.6;
    # max-throughput has no family level, so the same cells under it give the backend straight under the group.
    for regime in ("decode_batched", "throughput"):
        engine = f"{regime}|dense|llama.cpp"
        cells = {regime: [-0.2, 0.0, 0.2, 100, 30], f"{regime}|dense": [-0.2, 0.0, 0.2, 90, 28],
                 engine: [-0.2, 0.0, 0.2, 60, 20], f"{engine}|desktop": [-0.1, 0.1, 0.3, 40, 12],
                 f"{engine}|desktop|gguf k-quant": [0.1, 0.3, 0.5, 25, 6],
                 f"{engine}|desktop|gguf k-quant|cuda": [0.4, 0.6, 0.8, 15, 5],
                 f"{engine}|desktop|cuda": [0.4, 0.6, 0.8, 15, 5]}
        q = shrunk_quantiles(cells, cell_path(regime, False, "llama.cpp", "desktop", "cuda", "gguf k-quant"), 10)
        group = (12 * 0.1 + 10 * 0.0) / 22
        family = (6 * 0.3 + 10 * group) / 16
        parent = family if regime == "decode_batched" else group
        assert math.isclose(q[1], (5 * 0.6 + 10 * parent) / 15)


def test_band_widens_around_the_median_in_log_space():
    low, high = band(np.log([0.8, 1.0, 1.5]), widening=2.0)
    assert math.isclose(low, 0.8 ** 2) and math.isclose(high, 1.5 ** 2)


MODELS = ["llama-3.1-8b", "llama-3.1-70b", "mixtral-8x7b", "qwen3-30b-a3b", "gemma-2-9b", "qwen2.5-0.5b"]
DEVICES = ["h100", "a100 sxm4 80gb", "rtx 4090", "rtx 3090", "apple m2 ultra (76-core gpu)", "mi300x", "l40s"]
ENGINES = ["generic", "vLLM", "llama.cpp", "TensorRT-LLM", "sglang"]


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(MODELS), st.sampled_from(DEVICES), st.sampled_from(["bf16", "fp8", "Q4_K_M", "int4-awq"]),
       st.sampled_from(ENGINES), st.sampled_from([1, 8, 64]), st.sampled_from([128, 2048, 8192]))
def test_no_interval_beats_the_physical_roofline(model, device, fmt, engine, batch, prompt):
    e = estimate(model, device, weight_format=fmt, engine=engine, batch=batch, prompt_tokens=prompt,
                 output_tokens=128, calibration="none")
    limit = sweep([model], [device], [fmt], batches=[batch], prompt_tokens=[prompt], output_tokens=[128],
                  physical_limit=True, detail=True).row(0)
    r = e.results
    assert "decode_tps_per_seq_high" in r and "ttft_s_low" in r
    for speed in ("decode_tps_per_seq", "decode_tps_total", "prefill_tps", "throughput_out_tps"):
        if f"{speed}_high" in r:
            assert r[f"{speed}_high"] <= limit[speed] * (1 + 1e-9)
            assert r[speed] <= limit[speed] * (1 + 1e-9)        # the estimate itself never beats physics
    for time in ("ttft_s", "itl_s", "e2e_latency_s"):
        if f"{time}_low" in r:
            assert r[f"{time}_low"] >= limit[time] * (1 - 1e-9)


def test_fp16_accumulation_doubles_compute_only_on_geforce(db):
    llama_cpp = GENERIC_ENGINE.model_copy(update={"fp16_accumulate": True})
    for name, expected in (("rtx 4090", 2.0), ("rtx 6000 ada", 1.0), ("h100", 1.0)):
        ratio = [run(db.models.get("llama-3.1-8b"), db.hardware.get(name), B=1, T=4096, O=2, ideal=False,
                     engine=e)["prefill_tps"] for e in (GENERIC_ENGINE, llama_cpp)]
        # prefill of a 4k prompt is compute-bound: its speed follows the compute rate
        assert math.isclose(ratio[1] / ratio[0], expected, rel_tol=0.02), name


def test_attention_accumulating_qk_in_fp32_gains_a_third_on_geforce():
    """llama.cpp's attention accumulates QKᵀ in FP32 and P·V in FP16 (share 0.5): on a GeForce card (FP16
    accumulation twice the listed rate) half its FLOPs run at 1x and half at 2x, so 1 / (0.5 + 0.5/2) = 4/3 of the
    listed rate, while its GEMMs get 2x; elsewhere (speedup 1) both stay at 1x."""
    engine = GENERIC_ENGINE.model_copy(update={"fp16_accumulate": True, "attention_fp16_accumulate_share": 0.5})
    from estimator.efficiency.defaults import CLASS_ORDER, GROUP_ORDER
    for speedup, attention in ((2.0, 4 / 3), (1.0, 1.0)):
        hw = {"bandwidth_bytes_per_s": np.array([1e12]), "device_bandwidth_eff": np.array([1.0]),
              "device_compute_eff": np.array([1.0]), "device_class_code": np.array([CLASS_ORDER.index("consumer_gpu")]),
              "bandwidth_group_code": np.array([GROUP_ORDER.index("desktop")]),
              "attention_flops_per_s": np.array([1e14]), "fp16_accumulate_speedup": np.array([speedup])}
        f = {"engine_bandwidth_eff": np.array([1.0]), "dequantizes": np.array([False])}
        rates = effective_rates(hw, f, np.array([1e14]), engine)
        eff = engine.compute_eff_by_group.get("desktop", engine.compute_eff)
        assert math.isclose(rates["linear_flops_per_s"][0], 1e14 * eff * speedup)
        assert math.isclose(rates["attention_flops_per_s"][0], 1e14 * eff * attention)
    from estimator.efficiency.engine_profiles import engine as profile
    assert profile("llama.cpp").parameters.attention_fp16_accumulate_share == 0.5
    assert PHYSICAL_LIMIT.attention_fp16_accumulate_share == 1.0   # the limit keeps the whole FP16 rate


def test_dequantizing_kernels_have_their_own_group_factor():
    engine = GENERIC_ENGINE.model_copy(update={"bandwidth_scale_by_group": {"desktop": 1.2},
                                               "dequant_scale_by_group": {"desktop": 0.5}})
    hw = {"bandwidth_bytes_per_s": np.array([1e12]), "device_bandwidth_eff": np.array([1.0]),
          "device_compute_eff": np.array([1.0]), "device_class_code": np.array([2]),
          "attention_flops_per_s": np.array([1e14]), "fp16_accumulate_speedup": np.array([1.0])}
    from estimator.efficiency.defaults import CLASS_ORDER, GROUP_ORDER
    hw["device_class_code"] = np.array([CLASS_ORDER.index("consumer_gpu")])
    hw["bandwidth_group_code"] = np.array([GROUP_ORDER.index("desktop")])
    for dequantizes, scale, family in ((False, 1.2, "native"), (True, 0.5, "gguf")):
        f = {"engine_bandwidth_eff": np.array([engine.bandwidth_eff[family]]), "dequantizes": np.array([dequantizes])}
        rates = effective_rates(hw, f, np.array([1e14]), engine)
        assert math.isclose(rates["weight_bytes_per_s"][0], 1e12 * scale * engine.bandwidth_eff[family])
        # the attention kernels read the cache at their own share, whatever the weight kernels' group factor
        assert math.isclose(rates["kv_bytes_per_s"][0], 1e12 * engine.kv_bandwidth_eff)


def test_the_physical_limit_has_no_losses():
    assert set(PHYSICAL_LIMIT.bandwidth_eff.values()) == {1.0}
    assert PHYSICAL_LIMIT.per_step_s == PHYSICAL_LIMIT.per_layer_s == PHYSICAL_LIMIT.allreduce_latency_s == 0


def test_a_measured_gemm_ceiling_sets_the_device_compute_efficiency(db):
    """MI300X's best BF16 GEMM: 668.4 of 1,300 TFLOPS (stas00/ml-engineering MAMF table) = 0.514. A row whose
    table peak differs from hardware_db's is a fraction of hardware_db's: MI355X 1,565 of 2,516.6 (the table
    lists 2,300)."""
    from estimator.efficiency.defaults import HBM, device_defaults
    assert math.isclose(device_defaults(db.hardware.get("mi300x")).compute_eff, 668.4 / 1300, rel_tol=1e-3)
    mi355x = db.hardware.get("mi355x")
    measured_flops_per_s = device_defaults(mi355x).compute_eff * mi355x.peak_flops_per_s("bf16")
    assert math.isclose(measured_flops_per_s, 1565e12, rel_tol=2e-3)
    assert device_defaults(db.hardware.get("h100 pcie")).compute_eff == HBM.compute_eff    # not measured: the default
    fast, slow = (run(db.models.get("llama-3.1-8b"), db.hardware.get(n), B=1, T=4096, O=2, ideal=False)
                  for n in ("mi325x", "mi300x"))   # same datasheet peak, measured 0.604 vs 0.514
    assert math.isclose(fast["prefill_tps"] / slow["prefill_tps"], 0.604 / 0.514, rel_tol=0.03)


def test_an_engine_runs_on_the_devices_usual_backend_unless_told():
    on_amd = estimate("llama-3.1-8b", "mi300x", engine="llama.cpp", weight_format="Q4_K_M", calibration="none")
    on_nvidia = estimate("llama-3.1-8b", "h100", engine="llama.cpp", weight_format="Q4_K_M", calibration="none")
    told = estimate("llama-3.1-8b", "mi300x", engine="llama.cpp@vulkan", weight_format="Q4_K_M", calibration="none")
    assert (on_amd.engine, on_nvidia.engine, told.engine) == ("llama.cpp@rocm", "llama.cpp", "llama.cpp@vulkan")


def test_an_engine_without_fp4_kernels_computes_mxfp4_at_16_bit():
    """llama.cpp (build b6210) dequantizes MXFP4 for prompt processing; vLLM has a block-scaled path (MXFP8
    activations against the MXFP4 experts on Blackwell, at the FP8 rate).

    Published: discussion #15396, RTX 5090, gpt-oss-20b pp2048 = 9,848 tok/s. At the FP4 rate the
    estimate was 3.7x too fast; at the 16-bit rate it is within a factor of two."""
    kw = dict(weight_format="mxfp4-experts", prompt_tokens=2048, output_tokens=1, calibration="none")
    llama = estimate("gpt-oss-20b", "rtx 5090", engine="llama.cpp", **kw)
    vllm = estimate("gpt-oss-20b", "rtx 5090", engine="vLLM", **kw)
    assert (llama.compute_dtype, vllm.compute_dtype) == ("bf16", "mxfp8")
    assert 0.5 < llama.prefill_tps / 9848 < 2.0
    limits = {engine: sweep(["gpt-oss-20b"], ["rtx 5090"], ["mxfp4-experts"], prompt_tokens=[2048],
                            output_tokens=[1], engine=engine, physical_limit=True).columns["prefill_tps"][0]
              for engine in ("llama.cpp", "vLLM")}
    assert limits["llama.cpp"] < limits["vLLM"]          # the cap is the roofline of the math the engine uses
    assert llama.results["prefill_tps_high"] <= limits["llama.cpp"] * (1 + 1e-9)


def test_host_time_grows_with_the_batch_by_the_per_sequence_cost(db):
    """t_host = t_step + t_seq x batch: 64 sequences at 50 us each add 3.2 ms to every decode step."""
    base = GENERIC_ENGINE.model_copy(update={"per_sequence_s": 0.0})
    costly = GENERIC_ENGINE.model_copy(update={"per_sequence_s": 50e-6})
    itl = [run(db.models.get("llama-3.1-8b"), db.hardware.get("h100"), B=64, T=128, O=64, ideal=False,
               engine=e)["itl_s"] for e in (base, costly)]
    assert math.isclose(itl[1] - itl[0], 64 * 50e-6, rel_tol=1e-6)


def test_an_interval_off_its_estimate_says_which_way_runs_went():
    """A cell where the model runs fast has its band below the estimate (centred on the held-out median)."""
    assert band_remark(100.0, 80.0, 120.0, time=False) == ""
    assert band_remark(100.0, 20.0, 70.0, time=False).endswith("measured slower than estimated")   # speeds below
    assert band_remark(100.0, 120.0, 300.0, time=False).endswith("measured faster than estimated")
    assert band_remark(0.05, 0.1, 0.3, time=True).endswith("measured slower than estimated")      # times above
    assert band_remark(0.05, 0.01, 0.03, time=True).endswith("measured faster than estimated")


def test_a_measured_metrics_interval_is_capped_by_physics():
    # a speed band reaching past the roofline stops at it; a time band below it starts at it
    assert row_interval(100.0, (0.5, 3.0), 200.0, "decode_tps_per_seq")[:2] == (50.0, 200.0)
    assert row_interval(10.0, (0.2, 2.0), 8.0, "itl_ms")[:2] == (8.0, 20.0)
    assert row_interval(100.0, (0.2, 0.7), float("nan"), "throughput_out_tps")[2].endswith("slower than estimated")


def test_latencies_under_a_load_or_sent_at_once_take_the_serving_band():
    """As validation judges them: under a load every figure is a serving one; in a run that sends every request
    at once the latencies are the queue's and the run's throughput a max-throughput figure."""
    from estimator.evaluation.intervals import _shipped, shipped_band
    stored = _shipped()
    cell = {"moe": False, "family": "16-bit", "engine": "vLLM", "group": "datacenter", "backend": "cuda"}
    serving_low, serving_high = shipped_band(stored, "serving", **cell)
    throughput_low, _ = shipped_band(stored, "throughput", **cell)
    kw = {"engine": "vllm", "calibration": "none"}
    at_once = estimate("llama-3.1-8b", "h100", num_requests=500, **kw).results
    assert math.isclose(at_once["ttft_s_high"], at_once["ttft_s"] / serving_low, rel_tol=1e-9)
    assert math.isclose(at_once["itl_s_low"], at_once["itl_s"] / serving_high, rel_tol=1e-9)
    assert math.isclose(at_once["throughput_out_tps_low"], at_once["throughput_out_tps"] * throughput_low,
                        rel_tol=1e-9)
    loaded = estimate("llama-3.1-8b", "h100", concurrency=16, **kw)
    assert math.isclose(loaded.results["ttft_s_high"], loaded.results["ttft_s"] / serving_low, rel_tol=1e-9)
    assert loaded.results["interval_basis"].count("serving:") == 1     # one band, named once
    text = format_estimate(loaded)
    assert "TTFT (with queueing)" in text and text.count("(80%: ") >= 5


def test_a_single_clients_decode_takes_the_batch_one_band(db):
    """One client's ITL and decode speed are a batch of one's (band_regime): an estimate at concurrency 1 and a
    measured row of one client both read the decode_b1 cells, widened by their own factor; their first token,
    which carries the server's front end, and any load of more than one client keep the serving band."""
    from estimator.evaluation.intervals import _shipped, shipped_band
    from estimator.validation.predict import predict_rows
    stored = _shipped()
    cell = {"moe": True, "family": "fp8", "engine": "SGLang", "group": "datacenter", "backend": "cuda"}
    b1_low, b1_high = shipped_band(stored, "decode_one_client", **cell)
    serving_low, serving_high = shipped_band(stored, "serving", **cell)
    static_low, static_high = shipped_band(stored, "decode_b1", **cell)
    assert len({(b1_low, b1_high), (serving_low, serving_high), (static_low, static_high)}) == 3
    # the batch-1 cells, widened by the factor chosen on single clients' runs
    q = shrunk_quantiles(stored["cells"], cell_path("decode_b1", True, "SGLang", "datacenter", "cuda", "fp8"),
                         stored["prior_sources"])
    assert band(q, stored["widening_by_phase"]["decode_one_client"]) == (b1_low, b1_high)
    kw = {"engine": "sglang", "calibration": "none", "weight_format": "fp8", "n_gpus": 8}
    one = estimate("deepseek-v3", "b200", concurrency=1, **kw).results
    assert math.isclose(one["itl_s_high"], one["itl_s"] / b1_low, rel_tol=1e-9)
    assert math.isclose(one["decode_tps_per_seq_low"], one["decode_tps_per_seq"] * b1_low, rel_tol=1e-9)
    assert math.isclose(one["ttft_s_high"], one["ttft_s"] / serving_low, rel_tol=1e-9)
    assert one["interval_basis"].count("decode_one_client (decode_b1 cells):") == 1
    assert one["interval_basis"].count("serving:") == 1
    two = estimate("deepseek-v3", "b200", concurrency=2, **kw).results
    assert math.isclose(two["itl_s_high"], two["itl_s"] / serving_low, rel_tol=1e-9)
    row = {"id": "c1", "hardware": "NVIDIA B200", "n_gpus": "8", "model": "deepseek-ai/DeepSeek-V3", "engine": "SGLang",
           "weight_format": "fp8", "concurrency": "1", "input_len": "1024", "output_len": "1024"}
    itl, ttft, loaded = predict_rows([{**row, "metric": "itl_ms"}, {**row, "id": "t", "metric": "ttft_ms"},
                                      {**row, "id": "c2", "metric": "itl_ms", "concurrency": "2"}], db)
    assert math.isclose(float(itl["predicted_high"]), float(itl["predicted"]) / b1_low, rel_tol=1e-5)
    assert math.isclose(float(ttft["predicted_high"]), float(ttft["predicted"]) / serving_low, rel_tol=1e-5)
    assert math.isclose(float(loaded["predicted_high"]), float(loaded["predicted"]) / serving_low, rel_tol=1e-5)


def test_an_offline_batch_keeps_the_decode_and_prefill_bands():
    e = estimate("llama-3.1-8b", "h100", engine="vllm", calibration="none", batch=8).results
    assert e["interval_basis"].count("decode_batched:") == 1 and "prefill:" in e["interval_basis"]
    assert "serving" not in e["interval_basis"]
