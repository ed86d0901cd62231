"""Kept validation results: a key of everything the figures depend on, atomic entries, and `run` using them."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from estimator.validation import published, result_cache
from estimator.validation.dataset import Dataset, load_dataset


@pytest.fixture
def cache_folder(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv(result_cache.ENV_DIR, str(folder))
    return folder


@pytest.fixture(scope="module")
def dataset():
    return load_dataset()


def test_the_key_is_the_same_for_the_same_inputs(dataset, db):
    again = Dataset([dict(r) for r in dataset.rows], list(dataset.files))
    assert result_cache.validation_key(dataset, db) == result_cache.validation_key(again, db)


def test_a_changed_measurement_changes_the_key(dataset, db):
    rows = [dict(r) for r in dataset.rows]
    rows[17]["value"] = str(float(rows[17]["value"]) * 1.01)
    assert result_cache.validation_key(Dataset(rows, dataset.files), db) != result_cache.validation_key(dataset, db)


def test_the_key_does_not_depend_on_where_the_package_is_installed(dataset, db, tmp_path):
    """The suite imports the checkout and the notebook it runs the installed copy: one key for both. A file that a
    row names (its calibration profile) is part of the key by content, wherever it is read from."""
    copy = tmp_path / "measurements_db"
    shutil.copytree(dataset.rows[0]["folder"], copy, ignore=shutil.ignore_patterns("__pycache__"))
    moved = [{**r, "folder": str(copy)} for r in dataset.rows]
    assert result_cache.validation_key(Dataset(moved, dataset.files), db) == result_cache.validation_key(dataset, db)
    named = next(r["calibration"] for r in dataset.rows if r.get("calibration"))
    (copy / named).write_text((copy / named).read_text() + "\n# edited\n")
    assert result_cache.validation_key(Dataset(moved, dataset.files), db) != result_cache.validation_key(dataset, db)


def test_same_named_files_in_two_folders_both_count(dataset, db, tmp_path):
    """Two measurement folders may each hold a file of one name (a calibration profile); an edit to either one's
    content changes the key, not only to the first read."""
    named = next(r for r in dataset.rows if r.get("calibration"))
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        (folder / named["calibration"]).parent.mkdir(parents=True)
        shutil.copy(Path(named["folder"]) / named["calibration"], folder / named["calibration"])
    rows = [{**named, "folder": str(first)}, {**named, "id": named["id"] + "-again", "folder": str(second)}]
    before = result_cache.validation_key(Dataset(rows, dataset.files), db)
    edited = second / named["calibration"]
    edited.write_text(edited.read_text() + "\n# edited\n")
    assert result_cache.validation_key(Dataset(rows, dataset.files), db) != before


def test_a_changed_hardware_or_model_entry_changes_the_key(dataset, db):
    name = "H100 SXM"
    h100 = db.hardware.get(name)
    bandwidth = h100.memory.bandwidth.model_copy(update={"value": 3.3})
    slower = h100.model_copy(update={"memory": h100.memory.model_copy(update={"bandwidth": bandwidth})})
    other_hw = replace(db, hardware=replace(db.hardware, entries={**db.hardware.entries, h100.name: slower}))
    model = next(iter(db.models.entries.values()))
    renamed = model.model_copy(update={"notes": (model.notes or "") + " (copy)"})
    other_model = replace(db, models=replace(db.models, entries={**db.models.entries, model.name: renamed}))
    keys = {result_cache.validation_key(dataset, d) for d in (db, other_hw, other_model)}
    assert len(keys) == 3


def test_a_changed_file_of_a_package_changes_the_key(dataset, db, tmp_path, monkeypatch):
    """An engine profile edited on disk (as `validate --write` does) is a different key; so is a source file."""
    real = result_cache.resources.files
    copies = {name: tmp_path / name for name in ("engines_db", "estimator")}
    for name, copy in copies.items():
        shutil.copytree(Path(str(real(name))), copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(result_cache.resources, "files", lambda name: copies.get(name) or real(name))
    before = result_cache.validation_key(dataset, db)
    profile = copies["engines_db"] / "vllm.yaml"
    profile.write_text(profile.read_text() + "\n# edited\n")
    edited_profile = result_cache.validation_key(dataset, db)
    source = copies["estimator"] / "physics" / "__init__.py"
    source.write_text(source.read_text() + "\n")
    edited_source = result_cache.validation_key(dataset, db)
    assert len({before, edited_profile, edited_source}) == 3


def test_an_entry_round_trips_and_a_damaged_one_counts_as_absent(cache_folder):
    result_cache.store("k1", {"predicted": np.arange(3.0)})
    assert np.array_equal(result_cache.load("k1")["predicted"], np.arange(3.0))
    assert result_cache.load("k2") is None
    entry = next(cache_folder.glob("validation-k1.*"))
    entry.write_bytes(entry.read_bytes()[:10])
    assert result_cache.load("k1") is None
    assert not list(cache_folder.glob(".*.tmp"))   # no temporary file left behind


def test_only_the_newest_entries_are_kept(cache_folder):
    for i in range(result_cache.KEPT_ENTRIES + 2):
        result_cache.store(f"k{i}", i)
    kept = sorted(p.name for p in cache_folder.glob("validation-*"))
    assert len(kept) == result_cache.KEPT_ENTRIES
    assert result_cache.load(f"k{result_cache.KEPT_ENTRIES + 1}") == result_cache.KEPT_ENTRIES + 1


def test_a_folder_that_cannot_be_written_is_no_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(result_cache.ENV_DIR, str(blocker / "cache"))
    result_cache.store("k", 1)
    assert result_cache.load("k") is None


def test_run_returns_the_kept_result_without_fitting(published_validation, db, monkeypatch):
    """The session's cross-validation was kept (by the notebook or the fixture); a second `run` of the same
    inputs loads it, and `cache=False` computes afresh."""
    def refuse(*args, **kwargs):
        raise AssertionError("refitted although the result is kept")

    monkeypatch.setattr(published, "build_problem", refuse)
    again = published.run(db=db)
    assert again.from_cache
    assert np.array_equal(again.predicted, published_validation.predicted, equal_nan=True)
    assert published.headline(again) == published.headline(published_validation)
    with pytest.raises(AssertionError, match="refitted"):
        published.run(db=db, cache=False)


def test_the_command_says_when_it_loaded_a_kept_result(published_validation, capsys):
    from estimator.cli import main
    assert main(["validate", "--published", "--json"]) == 0
    assert "the result kept for the same data, code and library versions" in capsys.readouterr().err
