"""Golden tests: predictions against published measurements, with stated tolerances.

``fixtures/golden_decode.csv`` holds decode speeds copied from gpt-fast's README
(A100-80GB power-limited to 330 W, AMD MI250X; bf16 and int8 weight-only; TP 1-8)
and from XiongjieDai/GPU-Benchmarks-on-LLM-Inference (llama.cpp, Llama-3 8B/70B,
Q4_K_M and F16, one GPU), each row with its source URL.

Each row is predicted with its engine's profile (engines_db), whose parameters were
fitted on the whole dataset, these rows included: this is a regression guard on the
physics and the shipped parameters, not the accuracy figure. The figure quoted is
cross-validated by source (tests/test_validation.py). Tolerances: the error of every
row, and the median error of each source.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from estimator.validation.predict import predict_rows

ROWS = list(csv.DictReader((Path(__file__).parent / "fixtures" / "golden_decode.csv").open()))
# source -> (largest |error| of any row, largest median |error|)
TOLERANCE = {
    "gpt-fast": (0.30, 0.12),
    "xiongjiedai-gpu-bench": (1.00, 0.20),  # F16 on A100/H100 PCIe: llama.cpp reaches half the bandwidth
}


def _source(row):
    return "gpt-fast" if row["source"].startswith("gpt-fast") else row["source"]


@pytest.fixture(scope="module")
def errors(db):
    out = {}
    for row, result in zip(ROWS, predict_rows(ROWS, db)):
        # the F16 8B on a 16 GB RTX 4080 ran, though our 1 GiB runtime reserve calls it 0.1% too big
        assert result["status"] in ("ok", "does_not_fit"), (row["id"], result["reason"])
        out.setdefault(_source(row), []).append((row["id"], float(result["rel_error"])))
    return out


def test_every_golden_row_resolves(errors):
    assert sum(len(v) for v in errors.values()) == len(ROWS) >= 60


@pytest.mark.parametrize("source", sorted(TOLERANCE))
def test_decode_error_within_tolerance(errors, source):
    worst, median = TOLERANCE[source]
    rel = errors[source]
    assert statistics.median(abs(e) for _, e in rel) <= median
    outliers = [(i, round(e, 3)) for i, e in rel if abs(e) > worst]
    assert not outliers, outliers
