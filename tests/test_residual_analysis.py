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
