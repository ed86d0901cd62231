"""The dataset, the engine fit and its cross-validation, and the error figures we report."""

from __future__ import annotations

import math

import numpy as np
import pytest

from estimator.efficiency.engine_profiles import load_intervals
from estimator.evaluation.api import estimate
from estimator.specs.database import load_database
from estimator.validation.cross_validation import cross_validate
from estimator.validation.dataset import load_dataset
from estimator.validation.fitting import build_problem, fit_engine, theta_of
from estimator.validation.published import beyond_physical_limit, fit_failures, format_validation, headline, to_json


@pytest.fixture(scope="module")
def dataset():
    return load_dataset()


@pytest.fixture(scope="module")
def problem(dataset, db):
    return build_problem(dataset, db)


@pytest.fixture(scope="module")
def validation(published_validation):
    return published_validation


def test_dataset_meets_its_coverage_targets(dataset, problem):
    usable_sources = {r["source"] for r in dataset.usable()}
    assert len(problem.measured) >= 1200 and len(usable_sources) >= 25
    assert len({c.hardware.name for c in problem.resolved.configs}) >= 60
    recent = [r for r in dataset.usable() if r["date"] >= "2025" and r["engine_version"]]
    assert len(recent) >= 300
    assert {"decode_tps_per_seq", "prefill_tps", "ttft_ms", "throughput_out_tps"} <= set(problem.resolved.metrics)
    assert any(c.model.shape.moe for c in problem.resolved.configs)
    assert any(c.prompt_tokens >= 4096 for c, m in zip(problem.resolved.configs, problem.resolved.metrics)
               if m in ("prefill_tps", "ttft_ms"))


def test_every_row_has_a_url_and_a_known_metric(dataset):
    from estimator.validation.dataset import _cites_source
    from estimator.validation.metrics import METRICS
    for row in dataset.rows:
        assert _cites_source(row["url"]) and row["metric"] in METRICS and row["source"], row["id"]


def test_the_fit_is_deterministic(problem):
    first, second = fit_engine(problem, "llama.cpp"), fit_engine(problem, "llama.cpp")
    assert np.array_equal(theta_of(first), theta_of(second))


def test_parameters_round_trip_through_their_products():
    from estimator.validation.fitting import LOWER, PRIOR, UPPER, parameters_from
    theta = np.clip(PRIOR * np.linspace(0.8, 1.2, len(PRIOR)), LOWER, UPPER)   # inside the physical box
    assert np.allclose(theta_of(parameters_from(theta, bounded_per_sm=True)), theta)
    # an engine whose kernels are not bounded per SM has no rate per SM, whatever θ holds
    assert parameters_from(theta).native_bytes_per_s_per_sm is None


def test_a_device_streams_in_its_memorys_group_and_computes_in_its_markets(db):
    """The weight stream's engine factor comes from the memory's group (an L40S and an A40 carry GDDR6 like the
    desktop cards), the compute factor from the market's (they are datacenter boards): an engine with distinct
    factors per group shows which each rate took."""
    from estimator.efficiency.defaults import GENERIC_ENGINE, GROUP_OF_CLASS, bandwidth_group
    from estimator.efficiency.rates import effective_rates
    from estimator.evaluation.columns import compute_peak_table, format_columns, hardware_columns
    from estimator.specs.formats import weight_format

    cases = {"NVIDIA L40S": ("desktop", "datacenter"), "NVIDIA A40": ("desktop", "datacenter"),
             "NVIDIA H100 SXM": ("datacenter", "datacenter"), "NVIDIA GeForce RTX 4090": ("desktop", "desktop"),
             "NVIDIA DGX Spark": ("unified", "unified"), "Apple M2 Ultra (76-core GPU)": ("unified", "unified")}
    scale = {"datacenter": 1.0, "desktop": 0.5, "unified": 0.25}
    engine = GENERIC_ENGINE.model_copy(update={
        "bandwidth_scale_by_group": {g: v for g, v in scale.items() if g != "datacenter"},
        "compute_eff_by_group": {g: GENERIC_ENGINE.compute_eff * v for g, v in scale.items()}})
    devices = [db.hardware.get(name) for name in cases]
    fmts = [weight_format("bf16")]
    peaks, _ = compute_peak_table(fmts, devices)
    columns = hardware_columns(devices)
    mine = effective_rates(columns, format_columns(fmts), peaks[:, 0], engine)
    plain = effective_rates(columns, format_columns(fmts), peaks[:, 0], GENERIC_ENGINE)
    for i, (hw, (memory, market)) in enumerate(zip(devices, cases.values())):
        assert bandwidth_group(hw) == memory and GROUP_OF_CLASS[hw.device_class.value] == market
        assert mine["weight_bytes_per_s"][i] / plain["weight_bytes_per_s"][i] == pytest.approx(scale[memory])
        assert mine["linear_flops_per_s"][i] / plain["linear_flops_per_s"][i] == pytest.approx(scale[market])


def test_unified_bandwidth_is_pooled_with_the_gddr_cards_and_compute_with_all_groups():
    """Hand-worked pull: engine factors (log, over the typical device) of 0.0 / 0.3 / 0.3 for bandwidth and
    0.0 / 0.3 / 0.6 for compute (datacenter / desktop / unified). The unified bandwidth equals the desktop one, so
    it is not pulled at all, while the desktop one is pulled towards the mean of three, 0.2; compute's unified
    factor is pulled towards its mean, 0.3."""
    from estimator.validation.fitting import GROUP_POOL_WEIGHT, TYPICAL_LOG_EFF, _group_pull

    own = np.array([[0.0, 0.3, 0.3], [0.0, 0.3, 0.3], [0.0, 0.3, 0.6]])
    pull = _group_pull(np.concatenate([own.ravel() + TYPICAL_LOG_EFF, np.zeros(6)])).reshape(3, 3)
    assert pull[:2, 2] == pytest.approx([0.0, 0.0])
    assert pull[:2, 1] == pytest.approx([GROUP_POOL_WEIGHT * 0.1] * 2)
    assert pull[2] == pytest.approx(GROUP_POOL_WEIGHT * np.array([-0.3, 0.0, 0.3]))


def test_cross_validation_cannot_see_its_held_out_source(problem):
    source = "gpt-fast-readme"      # the only source of the gpt-fast engine
    tampered = build_tampered(problem, source, factor=10.0)
    held_out = problem.sources == source
    before, after = cross_validate(problem, only=[source]), cross_validate(tampered, only=[source])
    assert np.allclose(before[held_out], after[held_out])
    # while a fit that may see the source does move
    assert not np.array_equal(theta_of(fit_engine(problem, "gpt-fast")), theta_of(fit_engine(tampered, "gpt-fast")))


def test_folds_give_the_same_predictions_in_worker_processes(problem):
    sources = ["gpt-fast-readme", "mlc-blog-multigpu-2023"]   # small folds: a quick test
    done = {1: [], 2: []}
    here, workers = (cross_validate(problem, only=sources, jobs=n, progress=lambda k, total, n=n: done[n].append(
        (k, total))) for n in (1, 2))
    assert np.array_equal(here, workers, equal_nan=True) and np.isfinite(here).sum() > 0
    assert done[1] == done[2] == [(1, 2), (2, 2)]   # each fold reported as it finishes


def test_spawned_workers_receive_the_problem_and_give_the_same_predictions(problem, monkeypatch):
    """macOS and Windows start workers by spawning them: the problem and the fold function travel pickled."""
    import multiprocessing

    from estimator.validation import workers
    sources = ["gpt-fast-readme", "mlc-blog-multigpu-2023"]
    here = cross_validate(problem, only=sources, jobs=1)
    monkeypatch.setattr(workers, "_context", lambda: multiprocessing.get_context("spawn"))
    assert np.array_equal(here, cross_validate(problem, only=sources, jobs=2), equal_nan=True)


def build_tampered(problem, source, factor):
    """The same problem with one source's measurements multiplied by ``factor``."""
    from dataclasses import replace
    measured = np.where(problem.sources == source, problem.measured * factor, problem.measured)
    return replace(problem, measured=measured)


def test_rows_that_ran_are_never_dropped(dataset, problem, validation):
    """Every usable row that resolves is judged, those the memory model rejects included."""
    from estimator.validation.predict import resolve_rows
    _, results = resolve_rows(dataset.usable(), load_database())
    resolved = sum(r["status"] == "ok" for r in results)
    assert len(problem.measured) == resolved == len(validation.predicted)
    failures = fit_failures(validation)
    assert failures["count"] == int((~problem.fits).sum()) > 0
    assert headline(validation)["fit_failures"] == failures["count"]
    assert np.isfinite(validation.predicted[~problem.fits]).all()


def test_rows_measured_beyond_their_physical_limit_are_listed(validation):
    """No run beats 100% of datasheet with no overheads on the estimate's own reading of it, so a row that does is
    listed (and still judged). llama-batched-bench's gpt-oss-120b at 32 sequences on a DGX Spark is one: its
    random-token sequences touch fewer experts than uniform routing, which reads 81.7 of 128 a layer, 38.7 GB, at
    least 142 ms a step at 273 GB/s, and it measured 102 ms (docs/formulas.md §9)."""
    from dataclasses import replace
    beyond = beyond_physical_limit(validation)
    ids = [r["id"] for r in beyond["rows"]]
    batched = "dgxs-gpt-oss-120b-bb-pp512-b32-tg"
    assert batched in ids and len(set(ids)) == len(ids)
    assert all(r["speed_over_limit"] > 1 for r in beyond["rows"])
    assert beyond["count"] == len(ids) == sum(beyond["by_phase"].values()) < len(validation.predicted) / 20
    # the same row at half its limit's speed leaves the list; a decode row at twice its limit's joins it
    problem = validation.problem
    row_ids = np.array([row["id"] for row in problem.rows])
    inside = np.flatnonzero((problem.measured < problem.limit) & np.isin(problem.resolved.metrics,
                                                                         ["decode_tps_per_seq"]))[0]
    measured = problem.measured.copy()
    measured[row_ids == batched] = 0.5 * problem.limit[row_ids == batched]
    measured[inside] = 2 * problem.limit[inside]
    tampered = beyond_physical_limit(replace(validation, problem=replace(problem, measured=measured)))
    moved = [r["id"] for r in tampered["rows"]]
    assert batched not in moved and row_ids[inside] in moved and tampered["count"] == beyond["count"]
    assert next(r for r in tampered["rows"] if r["id"] == row_ids[inside])["speed_over_limit"] == pytest.approx(2.0)


# Median width (high / low) of the 80% band as of the last refit plus a margin: a guard against wider bands.
# Decode (1.70x) and prefill (1.85x) meet their 1.8x and 2.5x targets with cells that part by weight-format
# family and weigh their sources (estimator.evaluation.intervals); max-throughput is 1.77x.
WIDTH_GUARD = {"decode": 1.8, "prefill": 2.0, "throughput": 1.9}


# The target is 75-85% for every phase (decode 76%, prefill 82%, max-throughput 81% at the last refit).
COVERAGE_GUARD = {"decode": (0.75, 0.85), "prefill": (0.75, 0.85), "throughput": (0.75, 0.85)}


def test_intervals_cover_about_80_percent_out_of_source_per_phase(validation):
    for phase, (low, high) in COVERAGE_GUARD.items():
        quality = headline(validation)["phases"][phase]["interval"]
        assert quality["rows"] > 100
        assert low <= quality["coverage"] <= high, phase
        assert quality["median_width"] <= WIDTH_GUARD[phase], phase


def test_a_single_clients_decode_is_banded_with_batch_one_and_reported_as_serving(validation):
    """One client's ITL rows share the batch-1 decode cells (band_regime), with a widening of their own, yet stay
    serving rows: out of the fit, out of the decode headline, in the serving phase's coverage; the same client's
    TTFT keeps the serving cells."""
    labels, rows = validation.labels(), validation.problem.rows
    one = np.array([not r.get("request_rate") and r.get("concurrency") == "1" for r in rows])
    itl, ttft = one & (labels["metric"] == "itl_ms"), one & (labels["metric"] == "ttft_ms")
    assert itl.sum() >= 30 and ttft.sum() >= 30
    assert set(labels["phase"][itl | ttft]) == {"serving"} and validation.problem.judged_only[itl].all()
    assert set(labels["band regime"][itl]) == {"decode_one_client"} and set(labels["band regime"][ttft]) == {"serving"}
    r = validation.residuals()
    assert {r.paths[i][0] for i in np.flatnonzero(itl)} == {("decode_b1",)}
    assert set(r.phases[itl]) == {"decode_one_client"}


def test_widening_is_chosen_without_the_judged_source(validation):
    """Tampering with one source's residuals never moves that source's own band."""
    from estimator.validation.interval_calibration import held_out_bands
    r = validation.residuals()   # a fresh copy: tampering with it leaves the validation's own bands as computed
    source = "llamacpp-benches-dgx-spark"
    mine = r.sources == source
    before = validation.bands
    r.log_ratio = np.where(mine, r.log_ratio + 3.0, r.log_ratio)
    after = held_out_bands(r)
    assert np.allclose(before.low[mine], after.low[mine], equal_nan=True)
    assert np.allclose(before.high[mine], after.high[mine], equal_nan=True)
    assert not np.allclose(before.low[~mine], after.low[~mine], equal_nan=True)   # it moves the others


def test_error_has_not_got_worse_than_reported(validation):
    reported = load_intervals()["headline"]
    now = headline(validation)
    for key in ("decode_median_abs_error", "prefill_ttft_median_abs_error", "throughput_median_abs_error",
                "decode_p90_abs_error"):
        assert now[key] <= reported[key] + 0.005, key
    assert now["rows"] >= reported["rows"] * 0.95


def test_fitted_products_stay_within_physical_bounds():
    from estimator.efficiency.engine_profiles import load_engines
    for profile in load_engines():
        for name, p in (profile.fit.parameters if profile.fit else {}).items():
            assert p.lower <= p.value <= p.upper, (profile.name, name)
            if name.startswith(("bandwidth", "dequant_bandwidth")):
                assert p.upper <= 0.95
            if name.startswith("compute"):
                assert p.upper <= 1.0


def test_validation_report_has_every_table(validation):
    text = format_validation(validation)
    for part in ("leave one source out", "80% coverage", "By metric", "By engine", "By backend", "By device group",
                 "By format family", "By measurement year", "Fitted parameters on a bound", "Worst rows",
                 "predicted not to fit", "Measured beyond the physical limit"):
        assert part in text


def test_the_report_lists_every_parameter_that_ended_on_a_bound(validation):
    """The fit record's on_bound flags and the report's list agree, and each listed value is within 1% of its bound
    (a trust-region fit the prior pulls back stops just short of a bound: TensorRT-LLM's per-layer cost at 99.7 us)."""
    from estimator.validation.fit_record import fit_record
    from estimator.validation.fitting import GENERIC
    from estimator.validation.published import parameters_on_bound
    flagged = {(name, key) for name in validation.params if name != GENERIC
               for key, p in fit_record(validation.problem, name)["parameters"].items() if p["on_bound"]}
    listed = parameters_on_bound(validation)
    assert {(e, k) for e, k, _, _ in listed} == flagged
    assert all(abs(value / bound - 1) < 0.011 for _, _, value, bound in listed)


def test_validation_json_has_headline_splits_and_fit_record(validation):
    data = to_json(validation)
    assert {"decode", "prefill", "throughput", "serving"} <= set(data["headline"]["phases"])
    for by in ("engine", "backend", "device group", "format family", "measurement year"):
        assert data["splits"][by]
    # a row's year is its date's (measurements_db/SCHEMA.md: YYYY-MM or YYYY-MM-DD), "undated" without one
    years = set(data["splits"]["measurement year"])
    assert years <= {(row.get("date") or "")[:4] or "undated" for row in validation.problem.rows} and len(years) > 2
    assert all(y == "undated" or (y.isdigit() and len(y) == 4) for y in years)
    assert data["fit_failures"]["count"] == len(data["fit_failures"]["ids"])
    assert data["beyond_physical_limit"]["count"] == len(data["beyond_physical_limit"]["rows"])
    record = data["parameters"]["llama.cpp"]["parameters"]["bandwidth_datacenter"]
    assert {"value", "lower", "upper", "stderr", "on_bound"} <= set(record)


def test_estimates_carry_intervals():
    e = estimate("llama-3.1-8b", "rtx 4090", weight_format="Q4_K_M", engine="llama.cpp")
    d = e.to_dict()
    assert d["decode_tps_per_seq_low"] < d["decode_tps_per_seq"] < d["decode_tps_per_seq_high"]
    assert d["ttft_s_low"] < d["ttft_s"] < d["ttft_s_high"]
    assert "leave-one-source-out" in d["interval_basis"] and d["interval_calibrated"] is False


def test_predict_writes_an_interval_for_every_row(dataset, tmp_path):
    from estimator.validation.predict import predict_rows
    rows = [r for r in dataset.usable() if r["source"] == "xiongjiedai-gpu-bench"][:20]
    out = predict_rows(rows)
    for r in out:
        if r["status"] == "ok":
            assert float(r["predicted_low"]) < float(r["predicted"]) < float(r["predicted_high"]), r["id"]


def test_local_validation_runs_on_this_cpu(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import json

    from estimator.validation.local import validate_local
    monkeypatch.setenv("ROOFLINE_CALIBRATION_DIR", str(tmp_path))    # forces a (smoke) calibration first
    # short prompts and outputs: the quick runs themselves (128-token prompts) are the validation notebook's
    data = json.loads(validate_local("cpu", ["Qwen/Qwen2.5-0.5B"], quick=True, as_json=True, batches=[1, 4],
                                     prompts=[32], output_tokens=4))
    assert [(r["batch"], r["prompt"], r["output"]) for r in data["runs"]] == [(1, 32, 4), (4, 32, 4)]
    for run_ in data["runs"]:
        # structure and sanity only: measured timings move with whatever else runs on the machine, so how
        # close they come to the prediction is a benchmark figure, not a test
        for key in ("measured_ttft_s", "predicted_ttft_s", "measured_decode_tps", "predicted_decode_tps"):
            assert np.isfinite(run_[key]) and run_[key] > 0


def test_local_validation_rejects_mla(db):
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import torch

    from estimator.errors import ConfigurationError
    from calibrate.decoder import build_decoder
    with pytest.raises(ConfigurationError, match="MLA"):
        build_decoder(torch, db.models.get("deepseek-v2-lite").shape, "cpu", torch.float32)


def test_local_decoder_builds_moe_with_the_models_routing(db):
    """A small MoE with the routing of Qwen3-30B-A3B (top-k of E experts) runs prefill and decode."""
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import torch

    from calibrate.decoder import build_decoder
    from estimator.validation.local import measure
    spec = db.models.get("qwen3-30b-a3b")
    shape = spec.shape.model_copy(update={
        "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "vocab_size": 300, "moe": spec.shape.moe.model_copy(update={"num_experts": 8, "expert_intermediate_size": 32})})
    forward, new_cache = build_decoder(torch, shape, "cpu", torch.float32)
    got = measure(torch, forward, new_cache, "cpu", 300, batch=3, prompt=12, output=4)
    assert got["ttft_s"] > 0 and got["decode_tps_per_seq"] > 0


def test_local_validation_takes_batches_prompts_and_a_profile(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import json

    from calibrate.run import calibrate, tiny_plan
    from estimator.efficiency.calibration_profile import save_profile
    from estimator.validation.local import validate_local
    monkeypatch.setenv("ROOFLINE_CALIBRATION_DIR", str(tmp_path / "none"))
    profile_path = tmp_path / "profile.yaml"
    save_profile(calibrate("cpu", "quick", plan=tiny_plan("cpu")), profile_path)
    streamed = []
    data = json.loads(validate_local("cpu", ["Qwen/Qwen2.5-0.5B"], as_json=True, batches=[2], prompts=[16, 32],
                                     output_tokens=3, calibration=str(profile_path), progress=streamed.append))
    assert [(r["batch"], r["prompt"], r["output"]) for r in data["runs"]] == [(2, 16, 3), (2, 32, 3)]
    assert [json.loads(line) for line in streamed] == data["runs"]    # each row is reported as soon as it ran
    assert not list((tmp_path / "none").glob("*"))    # the given profile was used: nothing measured again


def test_predict_gives_each_bad_row_a_status_and_runs_the_rest(tmp_path):
    """Batch 0, a short row, a non-numeric value, a NaN length and an unknown engine setting each get a reason."""
    from estimator.validation.predict import predict_file
    header = "id,hardware,n_gpus,model,weight_format,batch,input_len,output_len,metric,value,cpu_moe\n"
    good = "ok,h100,1,llama-3.1-8b,bf16,1,512,128,decode_tps_per_seq,150,\n"
    bad = ["zero,h100,1,llama-3.1-8b,bf16,0,512,128,decode_tps_per_seq,150,\n",
           "short,h100,1\n",
           "text,h100,1,llama-3.1-8b,bf16,1,512,128,decode_tps_per_seq,fast,\n",
           "nan,h100,1,llama-3.1-8b,bf16,1,nan,128,decode_tps_per_seq,150,\n",
           "moe,h100,1,mixtral-8x7b,bf16,1,512,128,decode_tps_per_seq,50,99\n"]
    src, dst = tmp_path / "in.csv", tmp_path / "out" / "out.csv"
    src.write_text(header + good + "".join(bad) + good.replace("ok,", "ok2,"))
    predict_file(str(src), str(dst))
    import csv
    rows = {r["id"]: r for r in csv.DictReader(dst.open())}
    assert rows["ok"]["status"] == rows["ok2"]["status"] == "ok" and float(rows["ok"]["predicted"]) > 0
    for row_id in ("zero", "short", "text", "nan"):
        assert rows[row_id]["status"] == "invalid" and rows[row_id]["reason"], row_id
    assert rows["moe"]["status"] == "invalid" and "99" in rows["moe"]["reason"]     # more MoE layers than it has


def test_a_predict_row_naming_an_unknown_engine_is_refused_and_the_rest_run():
    """A misspelt engine cell ran as the generic engine, with no word in the output; an empty one or ``other``
    still takes the engine its framework text names."""
    from estimator.validation.predict import predict_rows
    row = {"id": "x", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "bf16",
           "batch": "1", "input_len": "512", "output_len": "128", "metric": "decode_tps_per_seq"}
    out = predict_rows([{**row, "engine": "vllmm"}, {**row, "engine": "vllm@nonsense"}, {**row, "engine": "vLLM"},
                        {**row, "engine": "other", "framework": "vLLM 0.8.5"}, {**row, "engine": ""}])
    assert [o["status"] for o in out] == ["unknown_engine", "unknown_engine", "ok", "ok", "ok"]
    assert "'vllmm'" in out[0]["reason"] and "'nonsense'" in out[1]["reason"]
    assert [o["engine"] for o in out[2:]] == ["vLLM", "vLLM", "generic"]


def test_the_dataset_refuses_an_engine_cell_that_names_no_profile():
    """What predict refuses as a row, the shipped dataset refuses as a database error naming the row: the schema
    once listed ExLlamaV3, which has no profile."""
    from estimator.validation.dataset import _row_problem
    row = {"id": "x", "url": "https://example.org/a", "metric": "ttft_ms", "source": "s", "date": "",
           "engine": "ExLlamaV3"}
    assert "'ExLlamaV3' names no profile" in _row_problem(row, set())
    for name in ("", "other", "vLLM", "llama.cpp@rocm", "trtllm"):
        assert _row_problem({**row, "engine": name}, set()) is None, name


def test_a_row_without_the_lengths_its_metric_needs_is_refused_naming_the_column():
    """An MLPerf summary states neither lengths: an empty cell was read as a 1-token prompt and output, and
    predicted 8xMI325X Mixtral 4-6x too slow. A throughput needs both lengths, a prompt's speed its own; a decode
    speed is read after a short prompt when the source gives none."""
    from estimator.validation.predict import predict_rows
    row = {"id": "x", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "bf16",
           "batch": "", "input_len": "", "output_len": "", "metric": "throughput_out_tps"}
    out = predict_rows([row, {**row, "id": "p", "metric": "prefill_tps", "batch": "1", "output_len": "0"},
                        {**row, "id": "d", "metric": "decode_tps_per_seq", "batch": "1"},
                        {**row, "id": "ok", "input_len": "294.5", "output_len": "300.5"}])
    assert [o["status"] for o in out] == ["invalid", "invalid", "ok", "ok"]
    assert "'input_len' is empty" in out[0]["reason"] and "throughput_out_tps" in out[0]["reason"]
    assert "'input_len' is empty" in out[1]["reason"]


@pytest.mark.parametrize("url, cited", [
    ("https://github.com/ggml-org/llama.cpp/discussions/15396", True),
    ("benchmarks/results/h200-2026-11-30/", True),        # a row this project measured: where its raw output is
    ("benchmarks/results/h200-2026-11-30/steady-validate-Llama-3.1-8B.json", True),
    ("", False), ("/etc/passwd", False), ("../elsewhere/run.json", False), ("see notes", False)])
def test_a_row_cites_a_web_page_or_the_repository_folder_of_its_run(url, cited):
    from estimator.validation.dataset import _cites_source
    assert _cites_source(url) is cited


def test_every_row_this_project_measured_points_at_committed_raw_output():
    from pathlib import Path

    from estimator.validation.dataset import load_dataset
    root = Path(__file__).parents[1]
    own = [r for r in load_dataset().rows if not r["url"].startswith("http")]
    assert own and all((root / r["url"]).exists() for r in own)


def test_an_eager_engine_has_its_own_per_layer_prior_and_bound():
    """Python-launched ops cost 0.5 ms per layer a priori and up to 2 ms, not the 100 us of a graph engine."""
    from estimator.validation.fitting import EAGER_MAX_PER_LAYER_S, PER_LAYER, UPPER, prior_and_bounds
    prior, _, upper = prior_and_bounds("transformers")
    assert upper[PER_LAYER] == EAGER_MAX_PER_LAYER_S and prior[PER_LAYER] == 5e-4
    assert prior_and_bounds("vllm")[2][PER_LAYER] == UPPER[PER_LAYER] == 1e-4


def test_an_engine_on_metal_pays_apple_s_cost_per_dispatch_per_layer():
    """Metal: 832 extra barrier-separated dispatches per token cost an M2 Pro 4.30 ms of GPU time, 5.16 us each
    (docs/formulas.md §9), so 25 to 50 dispatches per layer give a prior of 129 us and a bound of 258 us; the same
    engine on CUDA keeps the 100 us of CUDA launches."""
    from estimator.validation.fitting import PER_LAYER, UPPER, prior_and_bounds
    prior, _, upper = prior_and_bounds("llama.cpp@metal")
    assert math.isclose(4.30e-3 / 832, 5.16e-6, rel_tol=2e-3)
    assert math.isclose(prior[PER_LAYER], 129e-6, rel_tol=1e-3)
    assert math.isclose(upper[PER_LAYER], 258e-6, rel_tol=1e-3)
    on_cuda = (prior_and_bounds(name)[2][PER_LAYER] for name in ("llama.cpp", "llama.cpp@cuda"))
    assert all(bound == UPPER[PER_LAYER] for bound in on_cuda)


def test_the_gpu_proof_script_runs_end_to_end_on_this_cpu(tmp_path):
    """The script the H200 ran, dry-run on the CPU with the smallest settings and no `roofline` on the PATH: its
    first run on the GPU failed because `timeout` cannot run a shell function."""
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).parents[1]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "OUT": str(tmp_path / "out"), "INSTALL": "0",
           "PYTHON": sys.executable, "DEVICE": "cpu", "MODE": "smoke", "MODELS": "Qwen/Qwen2.5-0.5B", "BATCHES": "1",
           "PROMPT": "8", "OUTPUT": "3", "ROOFLINE_CALIBRATION_DIR": str(tmp_path / "profiles")}
    done = subprocess.run(["bash", str(root / "benchmarks" / "gpu_proof.sh")], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validate Qwen2.5-0.5B: exit 0" in done.stdout
    runs = json.loads((tmp_path / "out" / "validate-Qwen2.5-0.5B.json").read_text())["runs"]
    assert [(r["batch"], r["prompt"], r["output"]) for r in runs] == [(1, 8, 3)]
    assert (tmp_path / "out" / "profile.yaml").stat().st_size > 0


def test_the_reference_decoder_spreads_a_prompt_over_the_experts(db):
    """Random layers make a prompt's tokens alike, so a random router sent a 512-token prompt of Qwen3-30B-A3B's
    shapes to 20-25 of 128 experts past the first layers; each token now draws its experts as a balanced router
    spreads them, and 512 tokens x 8 choices reach all 128 in every layer (expected 127.9)."""
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import torch

    from calibrate.decoder import build_decoder
    spec = db.models.get("qwen3-30b-a3b")
    shape = spec.shape.model_copy(update={
        "num_layers": 12, "hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16,
        "vocab_size": 300, "moe": spec.shape.moe.model_copy(update={"expert_intermediate_size": 16})})
    forward, new_cache = build_decoder(torch, shape, "cpu", torch.float32)
    reached, unique = [], torch.unique

    def counting(x, *args, **kwargs):
        out = unique(x, *args, **kwargs)
        reached.append(out.numel())
        return out
    torch.unique = counting
    try:
        with torch.inference_mode():
            forward(torch.randint(0, 300, (1, 512)), new_cache(1, 512), 0)
    finally:
        torch.unique = unique
    assert len(reached) == 12 and min(reached) >= 120


def test_gddr_cards_sold_for_the_datacenter_stream_as_the_desktop_cards_do(validation):
    """XiongjieDai's llama.cpp decode on an L40S and an A40 (GDDR6 boards sold for the datacenter; 20 rows, their
    source held out). Predicted with the HBM parts' bandwidth factors they ran 22% and 26% faster than estimated
    in the median; streaming in the GDDR cards' group, the median error is 10%, and none is 20% off."""
    rows = validation.problem.rows
    mine = np.array([r["source"] == "xiongjiedai-gpu-bench" and r["hardware"] in ("NVIDIA L40S", "NVIDIA A40")
                     and r["metric"] == "decode_tps_per_seq" for r in rows])
    error = np.abs(validation.predicted[mine] / validation.problem.measured[mine] - 1)
    assert mine.sum() == 20
    assert np.median(error) < 0.12 and error.max() < 0.2


def test_a_batch_one_moe_decode_on_llama_cpp_pays_no_expert_tile(validation):
    """Discussion #15396's MI50 (gfx906, 1 TB/s HBM2, ROCm, b7129): gpt-oss-20b decodes at 120.9 and 111.0 tokens/s,
    its source held out. With a tile of tokens on each of the 24 x 4 experts the token touches, the step computed
    at ROCm's datacenter rate and was predicted at 14.8 (0.12x); llama.cpp runs one token's experts as mat-vecs,
    which pad nothing, and the held-out prediction is within 15%."""
    rows = validation.problem.rows
    mine = np.array([r["id"].startswith("d15396-amd-instinct-mi50-gpt-oss-20b-") and r["metric"] == "decode_tps_per_seq"
                     for r in rows])
    ratio = validation.predicted[mine] / validation.problem.measured[mine]
    assert mine.sum() == 2
    assert np.all(np.abs(ratio - 1) < 0.15), ratio


def test_a_kv_read_product_above_the_typical_devices_default_survives_the_round_trip():
    """The engine's KV factor was capped at 1, so a fitted product could not pass the datacenter default's 0.90
    although the box allows 0.95: TensorRT-LLM's sat at 0.9001, reported off its bound."""
    from estimator.validation.fitting import KV_BANDWIDTH, PRIOR, UPPER, parameters_from, theta_of
    theta = PRIOR.copy()
    theta[KV_BANDWIDTH] = 0.94
    assert UPPER[KV_BANDWIDTH] == 0.95
    assert math.isclose(theta_of(parameters_from(theta))[KV_BANDWIDTH], 0.94)


def test_a_problem_subset_by_indices_takes_a_row_given_twice_twice(problem):
    """The source bootstrap (benchmarks/source_bootstrap.py) draws a source twice: its rows must count twice."""
    idx = np.array([3, 0, 3])
    sub = problem.subset(idx)
    assert list(sub.measured) == [problem.measured[3], problem.measured[0], problem.measured[3]]
    assert sub.resolved.configs[0] is sub.resolved.configs[2] is problem.resolved.configs[3]
    mask = np.zeros(len(problem.measured), dtype=bool)
    mask[[0, 3]] = True
    assert list(problem.subset(mask).measured) == [problem.measured[0], problem.measured[3]]


def test_a_backend_variant_keeps_its_engines_kv_product(problem):
    """llama.cpp on Vulkan has too few long-context rows to tell its attention reads from its compute: it keeps the
    KV product llama.cpp's fit on the same rows gives, and the record says so instead of calling it fitted."""
    from estimator.validation.fit_record import fit_record
    from estimator.validation.fitting import KV_BANDWIDTH
    base, variant = (theta_of(fit_engine(problem, name)) for name in ("llama.cpp", "llama.cpp@vulkan"))
    assert variant[KV_BANDWIDTH] == pytest.approx(base[KV_BANDWIDTH], rel=1e-9)
    record = fit_record(problem, "llama.cpp@vulkan")["parameters"]["kv_bandwidth_datacenter"]
    assert record["inherited"] and not record["on_bound"]
    assert "inherited" not in fit_record(problem, "gpt-fast")["parameters"]["kv_bandwidth_datacenter"]


def test_a_parameter_no_row_depends_on_is_marked_unidentified(problem):
    """gpt-fast's rows are dense decodes on datacenter cards: its MoE tile and its FP4 share move no prediction, so
    its record calls them unidentified, with no standard error, while its datacenter bandwidth has one."""
    from estimator.validation.fit_record import fit_record
    record = fit_record(problem, "gpt-fast")["parameters"]
    for name in ("expert_tile_tokens", "fp4_compute_scale"):
        assert record[name]["identified"] is False and record[name]["stderr"] is None
        assert not record[name]["on_bound"]
    assert "identified" not in record["bandwidth_datacenter"] and record["bandwidth_datacenter"]["stderr"] > 0


@pytest.mark.parametrize("name", ["llama.cpp", "MLX", "TensorRT-LLM"])
def test_the_grouped_jacobian_is_the_one_scipy_takes(problem, name):
    """The fit moves the three groups' bandwidth, dequantizing and compute factors together where no row reads two of
    them; its Jacobian must be scipy's own forward differences: at the start and at a point inside the box, on
    llama.cpp (rows whose MoE experts run on the host CPU read the unified factors too), MLX (Apple's unified memory)
    and TensorRT-LLM (the three groups)."""
    from scipy.optimize._numdiff import approx_derivative

    from estimator.validation.fitting import (
        DIFF_STEP, GENERIC, applicable, _dependence, kernel_properties, _log_errors, parameters_from, prior_and_bounds)
    from estimator.validation.jacobian import column_groups, forward_steps, grouped_jacobian
    rows = problem.subset((problem.engines == name) & ~problem.judged_only)
    kernels = kernel_properties(name)
    prior, lower, upper = prior_and_bounds(name)
    free = applicable(kernels)
    depends = _dependence(rows)[:, free]
    log_lower, log_upper = np.log(lower[free]), np.log(upper[free])

    def data(log_free):
        log_theta = np.log(prior)
        log_theta[free] = log_free
        return _log_errors(rows, {name: parameters_from(np.exp(log_theta), **kernels)})

    assert name != GENERIC and len(column_groups(depends)) <= free.sum() - 5   # the groups save evaluations
    inside = np.random.default_rng(0).uniform(log_lower + 0.05, log_upper - 0.05)
    for x in (np.log(np.clip(prior, lower * 1.001, upper * 0.999))[free], inside):
        f0 = data(x)
        scipy_s = approx_derivative(data, x, method="2-point", rel_step=DIFF_STEP, f0=f0, bounds=(log_lower, log_upper))
        ours = grouped_jacobian(data, x, f0, forward_steps(x, log_lower, log_upper, DIFF_STEP), depends,
                                column_groups(depends))
        assert np.abs(scipy_s).max() > 0.1 and np.allclose(ours, scipy_s, rtol=0, atol=1e-9)


def test_published_context_sweep_reads_the_kv_cache_slower_than_the_weights(dataset):
    """llama-bench on a DGX Spark (273 GB/s), Qwen2.5-Coder-7B Q8_0, tg32: 29.30 tok/s at depth 0, 22.70 at 32,768.
    The extra time per token, 1/22.70 - 1/29.30 = 9.92 ms, reads 32,768 tokens x 57,344 B (28 layers x 4 KV heads
    x 128 x K and V x 2 B) = 1.88 GB: 189 GB/s, 0.69 of the datasheet, where the weights (7.51 GB a token) stream
    at 0.81 or more (all of the depth-0 step counted as weight reading). The estimate's KV share is its own."""
    rows = {r["id"]: float(r["value"]) for r in dataset.rows if r["id"].startswith("dgxs-qwen2.5-coder-7b-tg32")}
    short, long = rows["dgxs-qwen2.5-coder-7b-tg32"], rows["dgxs-qwen2.5-coder-7b-tg32-d32768"]
    kv_bytes_per_token = 28 * 4 * 128 * 2 * 2
    kv_fraction = 32768 * kv_bytes_per_token / (1 / long - 1 / short) / 273e9
    weight_fraction = 7.51e9 * short / 273e9
    assert kv_fraction == pytest.approx(0.69, abs=0.01) and weight_fraction == pytest.approx(0.81, abs=0.01)
    near, far = (estimate("qwen2.5-coder-7b", "dgx spark", engine="llama.cpp", weight_format="Q8_0",
                          prompt_tokens=depth + 1, output_tokens=32, calibration="none") for depth in (0, 32768))
    assert near.kv_cache_bytes_per_token == kv_bytes_per_token
    assert near.decode_bytes_weights == pytest.approx(7.51e9, rel=0.01)
    # the predicted slowdown over 32k tokens of context, 1.56x, against 1.29x measured: 1.41x until llama.cpp's MMQ
    # tile came to follow the pass, which charged MoE prompts compute at the 16-bit rate where MMQ runs on int8
    # tensor cores, so the refit took the dense 2024 prompts' slowdown from the cache product (0.51 to 0.39 of
    # datasheet; docs/formulas.md §9)
    assert near.decode_tps_per_seq / far.decode_tps_per_seq == pytest.approx(short / long, rel=0.25)
