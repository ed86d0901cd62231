"""Shared fixtures; the suite never reads the user's own databases or calibration profiles."""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.pop("ROOFLINE_DB_PATH", None)
os.environ["ROOFLINE_CALIBRATION_DIR"] = tempfile.mkdtemp(prefix="roofline-test-calibrations-")

from estimator.specs.database import load_database  # noqa: E402  (after the environment is set)


@pytest.fixture(scope="session")
def db():
    return load_database()


@pytest.fixture(scope="session")
def published_validation(db):
    """`roofline validate --published` (fit and leave-one-source-out), computed once for the whole suite."""
    from estimator.validation.published import run
    return run(db=db)
