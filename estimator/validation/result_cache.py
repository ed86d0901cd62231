"""Held-out results kept on disk under a key of everything they depend on, so a repeated
`roofline validate --published` (or the notebook and the test suite after it) loads in a fraction of a
second instead of refitting every fold for a minute and a half.

The key is a SHA-256 over the dataset's rows and the files they name (calibration profiles, request lengths),
every hardware and model entry (user folders included), every file of the project's packages (the estimator's
source, the engine profiles and their stored intervals) and the Python, numpy and scipy versions, but not where
the package is installed. Any change to any of them is a different key, so an entry is never invalidated by hand
and never stale; the newest few entries are kept, older ones deleted.

The folder is ``$ROOFLINE_CACHE_DIR``, else ``$XDG_CACHE_HOME/llm-roofline``, else ``~/.cache/llm-roofline``.
An entry that cannot be read (a partial write, an older pickle) counts as absent and is replaced. Entries are
pickles, which run code as they load: point the folder only at one that nobody else writes to.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
from importlib import metadata, resources
from pathlib import Path

from estimator.errors import ConfigurationError, write_atomically
from estimator.specs.database import Database
from estimator.validation.dataset import Dataset

ENV_DIR = "ROOFLINE_CACHE_DIR"
KEPT_ENTRIES = 3            # one entry is ~14 MB for the shipped dataset
PACKAGES = ("estimator", "calibrate", "engines_db", "hardware_db", "models_db", "measurements_db")
ROW_FILE_COLUMNS = ("calibration", "lengths")   # a row's files, relative to its folder (measurements_db/SCHEMA.md)
NUMERIC_LIBRARIES = ("numpy", "scipy")   # fits that stop at a tolerance round differently across versions


def cache_dir() -> Path:
    chosen = os.environ.get(ENV_DIR)
    if chosen:
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "llm-roofline"


def validation_key(dataset: Dataset, db: Database) -> str:
    """The SHA-256 (hex) of everything a cross-validation of ``dataset`` against ``db`` depends on."""
    digest = hashlib.sha256()
    digest.update(json.dumps([sys.version, *map(_version, NUMERIC_LIBRARIES)]).encode())
    # a row's folder says where the package is installed, which is no part of the result (the tests and the
    # notebook they run may import two copies); the files its columns name are, read from there
    digest.update(json.dumps([{k: v for k, v in row.items() if k != "folder"} for row in dataset.rows],
                             sort_keys=True).encode())
    for name, content_digest in _named_files(dataset.rows):
        digest.update(name.encode())
        digest.update(content_digest)
    for registry in (db.hardware, db.models):
        for name in sorted(registry.entries):
            # an entry's names are derived from its fields, so its fields are the whole of it
            entry = [registry.kind, name, registry.entries[name].model_dump(mode="json")]
            digest.update(json.dumps(entry, sort_keys=True).encode())
    for package in PACKAGES:
        root = Path(str(resources.files(package)))
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(f"{package}/{path.relative_to(root).as_posix()}".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _named_files(rows: list[dict]) -> list[tuple[str, bytes]]:
    """Every file the rows name (a calibration profile, a lengths file), as the name they give and the SHA-256 of
    its content, sorted. Files are told apart by folder and name, so two folders that each hold a file of one
    name count with both contents; the folder itself is left out (see :func:`validation_key`)."""
    paths = {(row.get("folder") or ".", row[column]) for row in rows for column in ROW_FILE_COLUMNS if row.get(column)}
    return sorted({(name, hashlib.sha256(path.read_bytes()).digest())
                   for folder, name in paths if (path := Path(folder) / name).is_file()})


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def _entry(key: str) -> Path:
    return cache_dir() / f"validation-{key}.pickle"


def load(key: str):
    """The stored result for ``key``, or None where there is none or it cannot be read."""
    try:
        with open(_entry(key), "rb") as f:
            return pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return None


def store(key: str, result) -> None:
    """Write atomically (a reader never sees half an entry), then keep only the newest entries. A folder that
    cannot be written to is no error: the result simply is not kept."""
    try:
        write_atomically(_entry(key), lambda partial: partial.write_bytes(
            pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)), force=True, flag="the kept result")
    except ConfigurationError:
        return
    folder = cache_dir()
    try:   # another process may be pruning the same folder
        entries = sorted(folder.glob("validation-*.pickle"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEPT_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        return
