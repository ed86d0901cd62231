"""Shared fixtures; the suite never reads the user's own databases, calibration profiles or kept results."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

os.environ.pop("ROOFLINE_DB_PATH", None)


def _session_folder(prefix: str) -> str:
    """A fresh folder for the session, deleted when it ends (the kept validation alone is ~14 MB)."""
    folder = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


os.environ["ROOFLINE_CALIBRATION_DIR"] = _session_folder("roofline-test-calibrations-")
# the validation notebook's kernel inherits this folder, so the notebook and the published_validation
# fixture cross-validate the shipped dataset once between them
os.environ["ROOFLINE_CACHE_DIR"] = _session_folder("roofline-test-cache-")

from estimator.specs.database import load_database  # noqa: E402  (after the environment is set)


@pytest.fixture(scope="session")
def db():
    return load_database()


@pytest.fixture(scope="session")
def published_validation(db):
    """`roofline validate --published` (fit and leave-one-source-out), computed once for the whole suite (or
    kept by the validation notebook, which runs first)."""
    from estimator.validation.published import run
    return run(db=db)
