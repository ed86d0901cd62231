"""Every notebook runs top to bottom (so a change that breaks one fails CI), within a time limit."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="notebook tests need the test extra (nbclient, ipykernel)")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))
TIME_LIMIT_S = 600   # per notebook; the validation notebook cross-validates the whole dataset (~3.5 min on 2 cores)


def test_the_four_tutorials_exist():
    assert {p.stem for p in NOTEBOOKS} == {"what_gpu_do_i_need", "memory_wall_explained", "procurement_report",
                                           "validate_against_measurements"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs(path, tmp_path):
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=TIME_LIMIT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    errors = [o for cell in book.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
