"""Load the hardware and model databases and look entries up by name.

Built-in entries ship inside the package (``hardware_db/``, ``models_db/``).
Users add their own YAML files from folders named by ``--db PATH`` or the
``ROOFLINE_DB_PATH`` environment variable (``os.pathsep``-separated); each
folder may hold ``hardware/`` and ``models/`` subfolders or the YAML files
directly, told apart by their keys. A user entry with the same name as a
built-in one replaces it, and says so in :attr:`Database.overrides`.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Generic, Iterable, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from estimator.errors import DatabaseError, UnknownNameError
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec

ENV_VAR = "ROOFLINE_DB_PATH"
Spec = TypeVar("Spec", bound=BaseModel)


def normalize(name: str) -> str:
    """Case- and punctuation-insensitive key: 'NVIDIA A100-SXM4-80GB' -> 'nvidiaa100sxm480gb'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise DatabaseError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise DatabaseError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_entry(kind: type[Spec], data: dict, origin: str) -> Spec:
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise DatabaseError(f"{origin}: invalid {kind.__name__} entry:\n{exc}") from None


@dataclass
class Registry(Generic[Spec]):
    """Entries of one kind, found by exact name, alias or id after :func:`normalize`."""

    kind: str
    entries: dict[str, Spec] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    _keys: dict[str, str] = field(default_factory=dict)

    def add(self, entry: Spec, names: Iterable[str], origin: str) -> None:
        canonical = entry.name
        for name in names:
            key = normalize(name)
            owner = self._keys.get(key)
            if owner is not None and owner != canonical:
                raise DatabaseError(
                    f"{origin}: name {name!r} of {canonical!r} is already used by {owner!r} "
                    f"({self.origins[owner]}); names must be unique after ignoring case and punctuation")
            self._keys[key] = canonical
        self.entries[canonical] = entry
        self.origins[canonical] = origin

    def get(self, name: str) -> Spec:
        canonical = self._keys.get(normalize(name))
        if canonical is None:
            raise UnknownNameError(self.unknown_message(name))
        return self.entries[canonical]

    def unknown_message(self, name: str) -> str:
        close_keys = difflib.get_close_matches(normalize(name), self._keys, n=8, cutoff=0.5)
        close = list(dict.fromkeys(self._keys[k] for k in close_keys))
        hint = f" Closest: {', '.join(close)}." if close else ""
        return (f"unknown {self.kind} {name!r}.{hint} "
                f"Run `roofline list {self.kind}s` for all names, or add a YAML entry with --db PATH.")

    def __iter__(self):
        return iter(self.entries.values())

    def __len__(self) -> int:
        return len(self.entries)


def hardware_names(hw: Hardware) -> list[str]:
    return [hw.name, *hw.aliases]


def model_names(model: ModelSpec) -> list[str]:
    return [model.name, model.hf_id, *model.aliases]


@dataclass
class Database:
    """Hardware and models, built-in plus user folders."""

    hardware: Registry[Hardware]
    models: Registry[ModelSpec]
    overrides: list[str] = field(default_factory=list)


def _builtin_files(package: str) -> list[tuple[str, str]]:
    root = resources.files(package)
    return sorted((f"{package}/{p.name}", p.read_text()) for p in root.iterdir() if p.name.endswith(".yaml"))


def _user_files(folders: Iterable[Path]) -> list[Path]:
    paths: list[Path] = []
    for folder in folders:
        if not folder.is_dir():
            raise DatabaseError(f"database folder {str(folder)!r} does not exist or is not a folder")
        paths.extend(sorted(folder.rglob("*.yaml")) + sorted(folder.rglob("*.yml")))
    return paths


def user_folders(extra: Iterable[str | os.PathLike] = ()) -> list[Path]:
    env = os.environ.get(ENV_VAR, "")
    return [Path(p) for p in env.split(os.pathsep) if p] + [Path(p) for p in extra]


def _add(db: Database, data: dict, origin: str, builtin: bool) -> None:
    if "memory" in data:
        entry = parse_entry(Hardware, data, origin)
        registry, names = db.hardware, hardware_names(entry)
    elif "shape" in data:
        entry = parse_entry(ModelSpec, data, origin)
        registry, names = db.models, model_names(entry)
    else:
        raise DatabaseError(f"{origin}: neither a hardware entry (needs 'memory') nor a model entry (needs 'shape')")
    if not builtin and entry.name in registry.entries:
        db.overrides.append(f"{entry.name}: {origin} replaces {registry.origins[entry.name]}")
        registry.entries.pop(entry.name)
        for key in [k for k, v in registry._keys.items() if v == entry.name]:
            registry._keys.pop(key)
    registry.add(entry, names, origin)


def load_database(extra_folders: Iterable[str | os.PathLike] = ()) -> Database:
    """Load built-in entries, then user folders (``ROOFLINE_DB_PATH``, then ``extra_folders``)."""
    return _load(tuple(str(p) for p in user_folders(extra_folders)))


@lru_cache(maxsize=8)
def _load(folders: tuple[str, ...]) -> Database:
    db = Database(Registry("gpu"), Registry("model"))
    for package in ("hardware_db", "models_db"):
        for origin, text in _builtin_files(package):
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                raise DatabaseError(f"{origin}: not valid YAML: {exc}") from None
            _add(db, data, origin, builtin=True)
    for path in _user_files(Path(f) for f in folders):
        _add(db, read_yaml(path), str(path), builtin=False)
    return db
