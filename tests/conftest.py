"""Shared fixtures: the built-in database, loaded once."""

from __future__ import annotations

import pytest

from estimator.db import load_database


@pytest.fixture(scope="session")
def db():
    return load_database()
