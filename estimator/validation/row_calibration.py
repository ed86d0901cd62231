"""A measurement row's calibration: the profile (``roofline calibrate``) of the machine the row ran on.

A row that names one in its optional ``calibration`` column is predicted with the profile's measured rates, as
``roofline estimate --calibration FILE`` predicts (:func:`estimator.evaluation.columns.apply_calibration`). A
profile measures the device and its host, and is never fitted on rows, so a held-out row may use its own.
"""

from __future__ import annotations

import functools
from pathlib import Path

from estimator.efficiency.calibration_profile import CalibrationProfile, load_profile
from estimator.errors import ConfigurationError, DatabaseError


def calibration_of_row(row: dict) -> CalibrationProfile | None:
    """The profile the row's ``calibration`` column names: a file, relative to the folder of the CSV that holds
    the row (``row["folder"]``, set by whoever read the file; else the working folder). None when the column is
    empty or absent."""
    name = (row.get("calibration") or "").strip()
    if not name:
        return None
    try:   # an absolute path stays as it is: pathlib's join drops the folder before it
        return _load(str(Path(row.get("folder") or ".") / name))
    except DatabaseError as exc:
        raise ConfigurationError(f"column 'calibration': {exc}") from None


@functools.lru_cache(maxsize=None)
def _load(path: str) -> CalibrationProfile:
    return load_profile(path)   # read once: many rows of a collection cite one profile
