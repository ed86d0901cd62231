"""The offline residual analysis (benchmarks/validation_residuals.py) groups rows by engine release series."""

import importlib.util
from pathlib import Path

import pytest

_SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "validation_residuals.py"
_spec = importlib.util.spec_from_file_location("validation_residuals", _SCRIPT)
residuals = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(residuals)


@pytest.mark.parametrize("version, series", [
    ("b2824", "b2xxx"), ("b10298", "b10xxx"), ("b999", "b0xxx"),            # llama.cpp builds by thousands
    ("0.7.3.dev138+g21f6ca217", "0.7"), ("v0.11.0", "0.11"), ("1.2.0rc1", "1.2"),   # releases by major.minor
    ("23b8cc4", "unstated"), ("", "unstated"),                              # a commit hash, or nothing
])
def test_version_series(version, series):
    assert residuals.version_series(version) == series


_AGREEMENT = Path(__file__).resolve().parents[1] / "benchmarks" / "source_agreement.py"
_spec2 = importlib.util.spec_from_file_location("source_agreement", _AGREEMENT)
agreement = importlib.util.module_from_spec(_spec2)
_spec2.loader.exec_module(agreement)


def test_sources_on_the_same_configuration_are_compared_and_others_are_not(db):
    """Two sources measure Llama-3.1-8B decode on one H100 (one under an alias) at 150 and 120 tok/s: one pair,
    150/120 - 1 = 25%; a third source at another batch, and a second row of the first source, are no pair."""
    from estimator.validation.dataset import Dataset
    from estimator.validation.fitting import build_problem

    base = {"url": "https://example.org/a", "framework": "vLLM", "engine": "vLLM", "engine_version": "0.9.0",
            "date": "2025-06-01", "hardware": "NVIDIA H100 SXM", "n_gpus": "1", "tp": "1",
            "model": "meta-llama/Llama-3.1-8B", "weight_format": "bf16", "kv_format": "bf16", "batch": "1",
            "input_len": "128", "output_len": "128", "metric": "decode_tps_per_seq", "statistic": "mean",
            "unit": "tok/s", "notes": "test"}
    rows = [{**base, "id": "a1", "source": "a", "value": "150"},
            {**base, "id": "a2", "source": "a", "value": "150", "input_len": "256"},
            {**base, "id": "b1", "source": "b", "value": "120", "model": "llama-3.1-8b",
             "url": "https://example.org/b"},
            {**base, "id": "c1", "source": "c", "value": "90", "batch": "8", "url": "https://example.org/c"}]
    pairs = agreement.comparisons(build_problem(Dataset(rows, []), db, 1))
    assert len(pairs) == 1 and pairs[0]["sources"] == ("a", "b") and pairs[0]["phase"] == "decode"
    assert pairs[0]["disagreement"] == pytest.approx(150 / 120 - 1)
