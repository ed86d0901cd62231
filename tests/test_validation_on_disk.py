"""The held-out figures cannot see the shipped engine profiles: checked on a copy of the package on disk.

The copy gets a small dataset (three sources; gpt-fast's README is the only source of its engine, so its
fold has no gpt-fast rows to fit on), then its shipped engines_db files are perturbed (every bandwidth,
compute and overhead parameter halved, the stored intervals removed). `roofline validate --published
--json --no-cache`, run against the copy before and after, must report the same held-out figures: both
runs compute (a kept result could not tell a leak from a hit).
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from estimator.validation.fitting import KERNEL_PROPERTIES, MEMORY_PROPERTIES

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("estimator", "calibrate", "hardware_db", "models_db", "engines_db", "measurements_db")
SOURCES = ("gpt-fast-readme", "llamacpp-benches-m2-ultra", "trtllm-perf-v0.9.0")


def _copy_package(dst: Path) -> None:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    rows, header = [], {}   # every collection's columns, optional ones included, in order
    for path in sorted((dst / "measurements_db").glob("*.csv")):
        reader = csv.DictReader(io.StringIO(path.read_text()))
        header.update(dict.fromkeys(reader.fieldnames))
        rows += [r for r in reader if r["source"] in SOURCES]
        path.unlink()
    out = io.StringIO()
    writer = csv.DictWriter(out, list(header), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (dst / "measurements_db" / "fixture.csv").write_text(out.getvalue())


def _perturb_engines(folder: Path) -> None:
    """Halve every fitted number of every shipped profile; the engine's properties (its kernels, its memory
    budget) are facts about the engine, not fitted, and stay."""
    def halve(value, key=""):
        if key in KERNEL_PROPERTIES + MEMORY_PROPERTIES:
            return value
        if isinstance(value, dict):
            return {k: halve(v, k) for k, v in value.items()}
        return value / 2 if isinstance(value, float) else value

    for path in folder.glob("*.yaml"):
        if path.name.startswith("_"):
            path.unlink()
            continue
        doc = yaml.safe_load(path.read_text())
        doc["parameters"] = halve(doc["parameters"])
        path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _validate(copy: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    code = ("import estimator, json, sys; from estimator.cli import main; sys.stderr.write(estimator.__file__); "
            "sys.exit(main(['validate', '--published', '--json', '--no-cache']))")
    done = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr.startswith(str(copy)), "the copy, not the installed package, must run"
    return json.loads(done.stdout)


def test_held_out_figures_do_not_move_when_shipped_profiles_change(tmp_path):
    copy = tmp_path / "copy"
    _copy_package(copy)
    before = _validate(copy)
    _perturb_engines(copy / "engines_db")
    after = _validate(copy)
    assert before["headline"]["rows"] > 100 and before["headline"]["sources"] == len(SOURCES)
    assert before["headline"] == after["headline"]
    assert before["splits"] == after["splits"]
