"""The dataset, the engine fit and its cross-validation, and the error figures we report."""

from __future__ import annotations

import numpy as np
import pytest

from estimator.efficiency.engine_profiles import load_intervals
from estimator.evaluation.api import estimate
from estimator.validation.cross_validation import cross_validate
from estimator.validation.dataset import load_dataset
from estimator.validation.fitting import build_problem, fit_engine, theta_of
from estimator.validation.published import calibrated_widening, coverage, format_validation, headline


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
    assert len(dataset.rows) >= 600
    assert len(dataset.sources) >= 8
    assert len({c.hardware.name for c in problem.resolved.configs}) >= 30
    assert {"decode_tps_per_seq", "prefill_tps", "ttft_ms", "throughput_out_tps"} <= set(problem.resolved.metrics)
    assert any(c.model.shape.moe for c in problem.resolved.configs)
    assert any(c.prompt_tokens >= 4096 for c, m in zip(problem.resolved.configs, problem.resolved.metrics)
               if m in ("prefill_tps", "ttft_ms"))


def test_every_row_has_a_url_and_a_known_metric(dataset):
    from estimator.validation.predict import METRICS
    for row in dataset.rows:
        assert row["url"].startswith("http") and row["metric"] in METRICS and row["source"], row["id"]


def test_the_fit_is_deterministic(problem):
    first, second = fit_engine(problem, "llama.cpp"), fit_engine(problem, "llama.cpp")
    assert np.array_equal(theta_of(first), theta_of(second))


def test_cross_validation_cannot_see_its_held_out_source(problem):
    source = "gpt-fast-readme"
    tampered = build_tampered(problem, source, factor=10.0)
    held_out = problem.sources == source
    before, after = cross_validate(problem, only=[source]), cross_validate(tampered, only=[source])
    assert np.allclose(before[held_out], after[held_out])
    # while a fit that may see the source does move
    assert not np.array_equal(theta_of(fit_engine(problem, "gpt-fast")), theta_of(fit_engine(tampered, "gpt-fast")))


def build_tampered(problem, source, factor):
    """The same problem with one source's measurements multiplied by ``factor``."""
    from dataclasses import replace
    measured = np.where(problem.sources == source, problem.measured * factor, problem.measured)
    return replace(problem, measured=measured)


def test_intervals_cover_about_80_percent_out_of_source(validation):
    k, covered = calibrated_widening(validation)
    assert 0.78 <= covered <= 0.92
    assert coverage(validation, 1.0) < covered        # the widening is needed, and it is measured


def test_error_has_not_got_worse_than_reported(validation):
    reported = load_intervals()["headline"]
    now = headline(validation)
    assert now["decode_median_abs_error"] <= reported["decode_median_abs_error"] + 0.005
    assert now["prefill_ttft_median_abs_error"] <= reported["prefill_ttft_median_abs_error"] + 0.005
    assert now["rows"] >= reported["rows"] * 0.95


def test_validation_report_has_every_table(validation):
    text = format_validation(validation)
    for part in ("leave one source out", "By metric", "By engine", "By device class", "By model type",
                 "Worst rows", "80% prediction intervals"):
        assert part in text


def test_estimates_carry_intervals():
    e = estimate("llama-3.1-8b", "rtx 4090", weight_format="Q4_K_M", engine="llama.cpp")
    d = e.to_dict()
    assert d["decode_tps_per_seq_low"] < d["decode_tps_per_seq"] < d["decode_tps_per_seq_high"]
    assert d["ttft_s_low"] < d["ttft_s"] < d["ttft_s_high"]
    assert "leave-one-source-out" in d["interval_basis"] and d["interval_calibrated"] is False


def test_local_validation_runs_on_this_cpu(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import json

    from estimator.validation.local import validate_local
    monkeypatch.setenv("ROOFLINE_CALIBRATION_DIR", str(tmp_path))    # forces a (smoke) calibration first
    data = json.loads(validate_local("cpu", ["Qwen/Qwen2.5-0.5B"], quick=True, as_json=True))
    assert len(data["runs"]) == 2
    for run_ in data["runs"]:
        for key in ("measured_ttft_s", "predicted_ttft_s", "measured_decode_tps", "predicted_decode_tps"):
            assert np.isfinite(run_[key]) and run_[key] > 0
        # a faithful model and a calibrated device: within a factor of 5 either way
        assert 0.2 < run_["predicted_decode_tps"] / run_["measured_decode_tps"] < 5


def test_local_validation_rejects_moe(db):
    pytest.importorskip("torch", reason="needs the calibrate extra")
    import torch

    from estimator.errors import ConfigurationError
    from estimator.validation.local import build_decoder
    with pytest.raises(ConfigurationError, match="dense GQA"):
        build_decoder(torch, db.models.get("mixtral-8x7b"), "cpu", torch.float32)
