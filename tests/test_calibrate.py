"""Calibration on this machine's CPU (small sizes), and profiles applied by the estimator.

The CUDA paths are exercised on a real GPU only (skipped here without one)."""

from __future__ import annotations

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
    assert again == profile and again.schema_version == 1 and again.complete
    assert again.device.kind == "cpu" and again.software["torch"] == torch.__version__
    with pytest.raises(DatabaseError, match="exists; pass --force"):
        save_profile(profile, path)


def test_numbers_are_positive_and_consistent(profile):
    s = profile.summary
    assert s.read_bandwidth_bytes_per_s > 1e9
    # a copy moves its bytes twice but cannot beat the read-only stream by a large factor
    assert s.copy_bandwidth_bytes_per_s < 2.5 * s.read_bandwidth_bytes_per_s
    square = {m["m"]: m["flops_per_s"] for m in profile.measurements
              if m["bench"] == "matmul" and m.get("ok") and m["dtype"] == "fp32" and m["m"] == m["n"] == m["k"]}
    assert square[512] > square[64]          # larger GEMMs reach higher FLOP/s
    skinny = {m["m"]: m["flops_per_s"] for m in profile.measurements
              if m["bench"] == "matmul" and m.get("ok") and m["dtype"] == "fp32" and m["n"] == 1024 and m["m"] <= 64}
    assert skinny[64] > skinny[1]            # more rows reuse each weight: FLOP/s grows with M
    assert s.launch_overhead_s > 0 and s.ridge_batch["fp32"] > 0
    assert all(m["ok"] for m in profile.measurements), [m for m in profile.measurements if not m["ok"]]


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


def test_estimate_for_the_local_machine_uses_measured_rates(profile):
    e = estimate("qwen2.5-0.5b", "local", weight_format="f32", calibration=profile, prompt_tokens=64,
                 output_tokens=16)
    assert e.hardware.name.endswith("(calibrated)") and e.efficiency_source.startswith("calibrated")
    # decode of a 0.5B f32 model is memory-bound: bytes / (measured bandwidth x engine efficiency)
    from estimator.efficiency.defaults import GENERIC_ENGINE
    streaming = e.decode_bytes_weights / (profile.summary.read_bandwidth_bytes_per_s
                                          * GENERIC_ENGINE.bandwidth_eff["native"])
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
    assert main(["calibrate", "--device", "cpu", "--smoke", "--out", str(out)]) == 1
    assert "--force" in capsys.readouterr().err
