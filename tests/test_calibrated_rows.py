"""A measurement row may cite the calibration of the machine it ran on (the optional `calibration` column): it is
then predicted with that profile's measured rates, exactly as `roofline estimate --calibration FILE` predicts."""

from __future__ import annotations

import csv
import shutil
from importlib import resources
from pathlib import Path

import pytest

from estimator.efficiency.calibration_profile import load_profile
from estimator.evaluation.api import estimate
from estimator.validation.dataset import _file_problem, load_dataset
from estimator.validation.predict import predict_file, predict_rows

PROFILE = "calibrations/h200-2026-11-30-call3-full.yaml"
ROW = {"id": "eager", "hardware": "NVIDIA H200 SXM 141GB", "n_gpus": "1", "model": "meta-llama/Llama-3.1-8B",
       "engine": "pytorch-eager", "weight_format": "bf16", "batch": "1", "input_len": "512", "output_len": "16",
       "metric": "decode_tps_per_seq"}


def _profile_path() -> Path:
    return Path(str(resources.files("measurements_db").joinpath(PROFILE)))


def test_a_calibrated_row_is_predicted_as_the_calibrated_estimate(db):
    """The reference decoder is host-bound on an H200 at batch 1: the row with the profile decodes at the profile's
    measured host cost (32 layers x eager_layer_s), the same figure `estimate --calibration` gives; without it, at
    the engine's fitted cost."""
    profile = load_profile(_profile_path())
    calibrated, plain = predict_rows([{**ROW, "calibration": str(_profile_path())}, ROW], db)
    direct = estimate("llama-3.1-8b", "h200", engine="pytorch-eager", weight_format="bf16", batch=1,
                      prompt_tokens=512, output_tokens=16, calibration=profile)
    assert float(calibrated["predicted"]) == pytest.approx(direct.decode_tps_per_seq, rel=1e-5)
    assert 1 / float(calibrated["predicted"]) == pytest.approx(32 * profile.summary.eager_layer_s, rel=0.1)
    assert abs(float(plain["predicted"]) / float(calibrated["predicted"]) - 1) > 0.05
    assert f"calibrated: {profile.label}" in calibrated["reason"] and "calibrated" not in plain["reason"]


def test_a_row_citing_another_devices_profile_is_predicted_with_a_warning(db):
    """The H200's profile on an A100 is applied as a ratio to the A100's datasheet, and the reason says it is
    borrowed, as `estimate --calibration` does."""
    borrowed, = predict_rows([{**ROW, "hardware": "NVIDIA A100 SXM4 80GB", "calibration": str(_profile_path())}], db)
    assert borrowed["status"] == "ok" and "BORROWED calibration of NVIDIA H200" in borrowed["reason"]


def test_a_predict_file_reads_its_calibrations_beside_it_and_a_missing_one_fails_only_its_row(tmp_path):
    shutil.copy(_profile_path(), tmp_path / "h200.yaml")
    src, dst = tmp_path / "in.csv", tmp_path / "out.csv"
    with src.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*ROW, "calibration"])
        writer.writeheader()
        writer.writerow({**ROW, "calibration": "h200.yaml"})
        writer.writerow({**ROW, "id": "missing", "calibration": "nowhere.yaml"})
        writer.writerow({**ROW, "id": "plain", "calibration": ""})
    predict_file(str(src), str(dst))
    rows = {r["id"]: r for r in csv.DictReader(dst.open())}
    assert rows["eager"]["status"] == rows["plain"]["status"] == "ok"
    assert rows["eager"]["predicted"] != rows["plain"]["predicted"]
    assert rows["missing"]["status"] == "invalid" and "column 'calibration'" in rows["missing"]["reason"]
    assert "nowhere.yaml" in rows["missing"]["reason"] and "Error" not in rows["missing"]["reason"]


def test_the_dataset_takes_only_a_calibration_that_is_one_of_its_files():
    folder = resources.files("measurements_db")
    assert _file_problem({"calibration": PROFILE}, folder, "calibration") is None
    assert _file_problem({"calibration": ""}, folder, "calibration") is None
    for name in ("calibrations/absent.yaml", "../hardware_db/calibrations/nvidia-h200-sxm-141gb-vm.yaml",
                 str(_profile_path())):   # an absolute path is refused even where the file exists
        assert name in _file_problem({"calibration": name}, folder, "calibration")
    # a run's own lengths likewise; a preset name is no file
    own = next(r["lengths"] for r in load_dataset().rows if r.get("lengths", "").endswith(".csv"))
    assert _file_problem({"lengths": own}, folder, "lengths", ".csv") is None
    assert _file_problem({"lengths": "sharegpt"}, folder, "lengths", ".csv") is None
    assert "lengths/absent.csv" in _file_problem({"lengths": "lengths/absent.csv"}, folder, "lengths", ".csv")


def test_every_calibrated_row_cites_a_profile_of_its_own_device_measured_the_day_it_ran(db):
    rows = [r for r in load_dataset().rows if r.get("calibration")]
    assert len(rows) >= 30
    for row in rows:
        profile = load_profile(Path(row["folder"]) / row["calibration"])
        assert profile.device.matched_hardware == db.hardware.get(row["hardware"]).name, row["id"]
        assert profile.created.startswith(row["date"]), row["id"]
