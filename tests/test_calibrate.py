"""Calibration on this machine's CPU (small sizes), and profiles applied by the estimator.

The CUDA paths are exercised on a real GPU only (skipped here without one)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch", reason="calibration needs the calibrate extra (torch)")

from calibrate import benchmarks as bm  # noqa: E402
from calibrate.run import calibrate, tiny_plan  # noqa: E402
from calibrate.summary import format_profile  # noqa: E402
from estimator.cli import main  # noqa: E402
from estimator.efficiency.calibration_profile import CalibrationProfile, load_profile, save_profile  # noqa: E402
from estimator.errors import ConfigurationError, DatabaseError  # noqa: E402
from estimator.evaluation.api import estimate  # noqa: E402


@pytest.fixture(scope="module")
def profile():
    return calibrate("cpu", "quick", plan=tiny_plan("cpu"))


def test_profile_round_trips_and_validates(profile, tmp_path):
    path = save_profile(profile, tmp_path / "cpu.yaml")
    again = load_profile(path)
    assert again == profile and again.schema_version == 3 and again.complete
    assert again.device.kind == "cpu" and again.software["torch"] == torch.__version__
    with pytest.raises(DatabaseError, match="exists; pass --force"):
        save_profile(profile, path)


def _between(value, low, high) -> bool:
    return value is not None and math.isfinite(value) and low <= value <= high


def test_every_planned_size_is_measured_and_recorded_consistently(profile):
    """Structure, which load on the machine cannot change (timings themselves can: see the next test)."""
    plan = tiny_plan("cpu")
    assert all(m["ok"] for m in profile.measurements), [m for m in profile.measurements if not m["ok"]]
    matmuls = [m for m in profile.measurements if m["bench"] == "matmul"]
    square = {(m["dtype"], m["m"]) for m in matmuls if m["m"] == m["n"] == m["k"]}
    skinny = {(m["dtype"], m["m"]) for m in matmuls if (m["n"], m["k"]) == plan.matmul_shapes[0]}
    assert square == {(d, size) for d in plan.dtypes for size in plan.gemm_sizes}
    assert skinny == {(d, rows) for d in plan.dtypes for rows in plan.matmul_rows}
    assert sorted(p.size_bytes for p in profile.summary.bandwidth_curve) == sorted(plan.bandwidth_sizes)
    for m in matmuls:   # each rate is the work of that shape over the median of its repetitions
        assert m["p10_s"] <= m["median_s"] <= m["p90_s"] and m["reps"] >= 1
        assert m["flops_per_s"] == pytest.approx(2 * m["m"] * m["n"] * m["k"] / m["median_s"], rel=1e-9)
    s = profile.summary
    assert s.gemm_flops_per_s["fp32"] == max(m["flops_per_s"] for m in matmuls
                                             if m["dtype"] == "fp32" and m["m"] == m["n"] == m["k"])
    assert s.ridge_batch["fp32"] == pytest.approx(4 * s.gemm_flops_per_s["fp32"] / (2 * s.gemv_bytes_per_s["fp32"]))
    expand, = (m for m in profile.measurements if m["bench"] == "kv_expand")   # grouped KV heads copied out
    assert expand["compact_bytes"] <= plan.kv_expand_bytes and expand["group"] == 4
    assert s.kv_expand_bytes_per_s == pytest.approx(5 * expand["compact_bytes"] / expand["median_s"], rel=1e-9)


def test_numbers_are_physically_plausible(profile):
    """Sanity bounds wide enough to hold while other processes compete for the CPU.

    Orderings between two timings (a larger GEMM reaching more FLOP/s, a copy slower than a read)
    hold on an idle machine but not on a busy one, where a multi-threaded kernel can lose its
    time slice; they are not asserted. What is asserted is that every figure is a finite, positive
    rate within the range of real hardware.
    """
    s = profile.summary
    assert _between(s.read_bandwidth_bytes_per_s, 1e7, 1e13)          # 10 MB/s to 10 TB/s
    assert _between(s.copy_bandwidth_bytes_per_s, 1e7, 1e13)
    assert all(_between(v, 1e6, 1e16) for v in s.gemm_flops_per_s.values())
    assert all(_between(v, 1e6, 1e13) for v in s.gemv_bytes_per_s.values())
    assert _between(s.attention_flops_per_s, 1e6, 1e16)
    assert _between(s.kv_expand_bytes_per_s, 1e7, 1e13)
    assert _between(s.launch_overhead_s, 1e-9, 1.0) and _between(s.small_op_chain_s_per_op, 1e-9, 1.0)
    assert all(_between(v, 1e-6, 1e9) for v in s.ridge_batch.values())


def test_interruption_keeps_what_was_measured(monkeypatch):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(bm, "attention", interrupt)
    p = calibrate("cpu", "quick", plan=tiny_plan("cpu"))
    assert not p.complete and p.summary.read_bandwidth_bytes_per_s > 0
    assert not any(m["bench"] == "launch" for m in p.measurements)


def test_failures_are_recorded_not_fatal(monkeypatch):
    real = bm.matmul

    def flaky(torch_, device, dtype, *args, **kwargs):
        if dtype == "bf16":
            raise RuntimeError("CUDA out of memory (simulated)")
        return real(torch_, device, dtype, *args, **kwargs)
    monkeypatch.setattr(bm, "matmul", flaky)
    p = calibrate("cpu", "quick", plan=tiny_plan("cpu"))
    failed = [m for m in p.measurements if not m["ok"]]
    assert failed and all("out of memory" in m["error"] for m in failed)
    assert "bf16" not in p.summary.gemm_flops_per_s and "fp32" in p.summary.gemm_flops_per_s
    assert "skipped" in format_profile(p, None)


@pytest.mark.parametrize("device, message", [("tpu", "unknown device 'tpu'"), ("cuda", "no CUDA device")])
def test_bad_devices_are_clear_errors(device, message):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ConfigurationError, match=message):
        calibrate(device, "quick", plan=tiny_plan("cpu"))


@pytest.fixture(scope="module")
def steady_profile(profile):
    """The measured profile with fixed rates of this CPU's order (a busy machine measures anything), so the
    tests below check how the estimate uses a profile, not how fast the machine was that minute."""
    fixed = {"read_bandwidth_bytes_per_s": 20e9, "gemm_flops_per_s": {"fp32": 200e9},
             "weight_stream_bytes_per_s": {"fp32": {1: 12e9, 4: 16e9, 16: 20e9, 64: 20e9}}}
    return profile.model_copy(update={"summary": profile.summary.model_copy(update=fixed)})


def test_estimate_for_the_local_machine_uses_measured_rates(steady_profile):
    e = estimate("qwen2.5-0.5b", "local", weight_format="f32", calibration=steady_profile, prompt_tokens=64,
                 output_tokens=16)
    assert e.hardware.name.endswith("(calibrated)") and e.efficiency_source.startswith("calibrated")
    # decode of a 0.5B f32 model at batch 1 is memory-bound: its weights stream at the measured one-row GEMM
    # rate (the decode curve, not the read plateau), times the engine's own factor
    from estimator.efficiency.defaults import GENERIC_ENGINE
    streaming = e.decode_bytes_weights / (12e9 * GENERIC_ENGINE.bandwidth_eff["native"])
    assert e.decode_linear_s == pytest.approx(streaming, rel=0.05)


def test_the_calibration_measures_the_decode_curve(profile):
    assert set(profile.summary.weight_stream_bytes_per_s["fp32"]) == {1, 4, 16, 64}
    assert "fp32 weight stream (M=4)" in format_profile(profile, None)   # the summary shows the curve


def test_the_decode_curve_is_read_at_the_batch_in_log_rows(steady_profile):
    """transformers runs PyTorch's own GEMMs: at batch 2 its weights stream at the curve's rate halfway (in log
    M) between the measured 1- and 4-row rates, with no engine factor on top."""
    curve = steady_profile.summary.weight_stream_bytes_per_s["fp32"]
    e = estimate("qwen2.5-0.5b", "local", weight_format="f32", calibration=steady_profile, batch=2,
                 prompt_tokens=64, output_tokens=16, engine="transformers")
    rate = curve[1] + 0.5 * (curve[4] - curve[1])
    # two rows of a 0.5B model: about 2 GFLOP a step against ~0.2 TFLOPS, far under the weights' memory time
    assert e.decode_linear_s == pytest.approx(e.decode_bytes_weights / rate, rel=0.05)


def test_a_prompt_runs_at_the_measured_gemm_rate_under_pytorchs_own_gemms(steady_profile):
    """transformers runs PyTorch's own GEMMs: a prefill long enough to be compute-bound runs at the calibration's
    measured GEMM rate, with no engine factor on top, and its unfused elementwise passes at the measured read
    plateau; an engine with its own kernels keeps its factor and fuses those ops."""
    from estimator.efficiency.engine_profiles import engine
    runs = {name: estimate("qwen2.5-0.5b", "local", weight_format="f32", calibration=steady_profile, batch=4,
                           prompt_tokens=512, output_tokens=16, engine=name) for name in ("transformers", "vllm")}
    measured = steady_profile.summary.gemm_flops_per_s["fp32"]
    own = runs["transformers"]
    passes_s = own.prefill_bytes_elementwise / steady_profile.summary.read_bandwidth_bytes_per_s
    assert passes_s > 0 and runs["vllm"].prefill_bytes_elementwise == 0
    assert own.prefill_linear_s == pytest.approx(own.prefill_flops_linear / measured + passes_s, rel=0.02)
    factor = engine("vllm").parameters.compute_eff_by_group["unified"]   # a CPU is in the unified group
    assert runs["vllm"].prefill_linear_s == pytest.approx(own.prefill_flops_linear / measured / factor, rel=0.02)


def test_timed_calls_never_reuse_the_warm_up_inputs():
    """A rotated benchmark's timed calls run on from the warm-up's indices: restarting at 0 timed inputs the
    warm-up had just left in the cache."""
    from calibrate.timing import measure
    seen = []
    measure(torch, "cpu", seen.append, warmup=3, reps=5)
    assert seen[:3] == [0, 1, 2] and seen[3:8] == [3, 4, 5, 6, 7]


def test_a_small_weight_matrix_is_rotated_past_twice_the_cache():
    """Decode streams its weights from memory: the decode-curve benchmark cycles through enough copies of a
    small matrix to pass twice the last-level cache (eight 4 MB copies fit a 32 MB cache)."""
    result = bm.matmul(torch, "cpu", "fp32", 1, 1024, 1024, llc_bytes=32 * 2**20, budget_bytes=2**30, reps=1)
    assert result["buffers"] == 17 and result["buffers"] * 4 * 2**20 > 2 * 32 * 2**20


def test_a_profile_without_the_curve_streams_at_the_read_plateau(steady_profile):
    """Profiles written before the curve was measured keep estimating as they did."""
    from estimator.efficiency.defaults import GENERIC_ENGINE
    bare = steady_profile.model_copy(
        update={"summary": steady_profile.summary.model_copy(update={"weight_stream_bytes_per_s": {}})})
    e = estimate("qwen2.5-0.5b", "local", weight_format="f32", calibration=bare, output_tokens=16)
    plateau = bare.summary.read_bandwidth_bytes_per_s
    streaming = e.decode_bytes_weights / (plateau * GENERIC_ENGINE.bandwidth_eff["native"])
    assert e.decode_linear_s == pytest.approx(streaming, rel=0.05)


def test_a_borrowed_profile_is_flagged(profile):
    e = estimate("llama-3.1-8b", "h100", calibration=profile)
    assert any("BORROWED" in w for w in e.warnings) and "BORROWED" in e.efficiency_source


def test_auto_finds_a_profile_for_the_device(profile, tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CALIBRATION_DIR", str(tmp_path))
    assert estimate("llama-3.1-8b", "h100").efficiency_source.startswith("datasheet")
    h100 = profile.model_copy(update={"device": profile.device.model_copy(
        update={"name": "NVIDIA H100 80GB HBM3", "matched_hardware": "NVIDIA H100 SXM"})})
    save_profile(CalibrationProfile.model_validate(h100.model_dump()), tmp_path / "h100.yaml")
    assert estimate("llama-3.1-8b", "h100").efficiency_source.startswith("calibrated")
    assert estimate("llama-3.1-8b", "h100", calibration=None).efficiency_source.startswith("datasheet")


def test_local_without_a_profile_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CALIBRATION_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError, match="run `roofline calibrate` first"):
        estimate("llama-3.1-8b", "local")


def test_cli_compare(profile, tmp_path, capsys):
    a = save_profile(profile, tmp_path / "a.yaml")
    b = save_profile(profile, tmp_path / "b.yaml")
    assert main(["calibrate", "--compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "read bandwidth" in out and "1.00x" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_calibration_matches_the_database():
    p = calibrate("cuda", "quick", plan=tiny_plan("cuda"))
    assert p.device.matched_hardware is not None and 0.3 < p.summary.bandwidth_efficiency <= 1.05


def test_cli_calibrate_writes_a_profile_and_never_overwrites(tmp_path, capsys):
    out = tmp_path / "me.yaml"
    assert main(["calibrate", "--device", "cpu", "--smoke", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "read bandwidth (plateau)" in text and "profile written to" in text
    assert load_profile(out).device.kind == "cpu"
    assert main(["calibrate", "--device", "cpu", "--smoke", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_peer_copy_is_skipped_on_one_gpu_and_says_so():
    """No GPU needed: a fake torch that sees one CUDA device."""
    from pathlib import Path
    from types import SimpleNamespace
    fake = SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 1))
    with pytest.raises(bm.Skipped, match="one GPU"):
        bm.peer_transfer(fake, 1 << 20)
    profile = load_profile(Path(__file__).parents[1] / "hardware_db/calibrations/amd-epyc-2-vcpu-ci-machine.yaml")
    skipped = profile.model_copy(update={"measurements": [*profile.measurements, {
        "bench": "peer_transfer", "ok": False, "skipped": "one GPU visible (1): no peer to copy to"}]})
    assert "peer_transfer : one GPU visible" in format_profile(skipped, None)


def test_int8_products_of_few_rows_are_skipped_and_say_why():
    """Seen on an H200 (torch 2.11): torch._int_mm takes only more than 16 rows. Nothing is timed or allocated
    for fewer, so no GPU is needed to check it (torch is never touched)."""
    with pytest.raises(bm.Skipped, match="more than 16 rows, not 16"):
        bm.matmul(None, "cuda", "int8", 16, 4096, 4096, llc_bytes=1, budget_bytes=1)


def test_the_eager_host_benchmark_times_the_reference_decoder(profile):
    """Structure only (a busy machine may time anything): two depths, dense and MoE, and the fitted costs
    in the summary only when the differences came out positive."""
    eager = next(m for m in profile.measurements if m["bench"] == "eager_host")
    assert eager["ok"] and eager["depths"] == list(bm.EAGER_DEPTHS)
    assert all(t > 0 for t in eager["dense_step_s"] + eager["moe_step_s"])
    for key, value in (("eager_layer_s", eager["per_layer_s"]), ("eager_expert_s", eager["per_expert_s"])):
        assert getattr(profile.summary, key) == (value if value > 0 else None)


def test_the_h200_profile_is_what_the_gpu_run_measured():
    """The committed profile of the H200 run (the second session's, in the rows' VM): its datasheet shares, eager
    host costs and KV-head expansion rate as measured."""
    from pathlib import Path
    h200 = load_profile(Path(__file__).parents[1] / "hardware_db/calibrations/nvidia-h200-sxm-141gb-vm.yaml")
    s = h200.summary
    assert h200.device.matched_hardware == "NVIDIA H200 SXM 141GB" and h200.mode == "full"
    assert 0.8 < s.bandwidth_efficiency < 0.9 and 0.7 < s.compute_efficiency["bf16"] < 0.85
    assert 0.25e-3 < s.eager_layer_s < 0.45e-3 and 0.12e-3 < s.eager_expert_s < 0.25e-3
    assert 1.0e12 < s.kv_expand_bytes_per_s < 0.5 * s.copy_bandwidth_bytes_per_s
    assert any(m.get("skipped", "").startswith("one GPU visible") for m in h200.measurements)
