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

from estimator.errors import (
    DatabaseError,
    UnknownNameError,
    describe_validation_error,
    load_yaml,
    parse_yaml,
    read_text,
)
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec

ENV_VAR = "ROOFLINE_DB_PATH"
Spec = TypeVar("Spec", bound=BaseModel)


def normalize(name: str) -> str:
    """Case- and punctuation-insensitive key: 'NVIDIA A100-SXM4-80GB' -> 'nvidiaa100sxm480gb'."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


# Device names as tools and shops write them ("NVIDIA B200 SXM 180GB", rocm-smi's "AMD Radeon RX 7900 XTX",
# system_profiler's "Apple M2 Ultra" + "Total Number of Cores: 76") carry words an entry's names may leave out.
# A name that misses exactly is looked up again without them, and then only if the words it dropped agree with
# the entry: a memory size with its capacity, a GPU core count, a form factor or memory type with its names.
VENDOR_WORDS = {"nvidia", "amd", "apple", "intel", "qualcomm", "geforce", "radeon", "instinct", "tesla", "graphics"}
FORM_FACTORS = {"sxm": "sxm", "sxm2": "sxm", "sxm3": "sxm", "sxm4": "sxm", "sxm5": "sxm", "sxm6": "sxm",
                "pcie": "pcie", "oam": "oam"}
MEMORY_WORDS = {"hbm2", "hbm2e", "hbm3", "hbm3e", "gddr5", "gddr5x", "gddr6", "gddr6x", "gddr7", "lpddr5", "lpddr5x"}
_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)\s*(?:gb|gib|g)(?![a-z0-9])")
_CORES = re.compile(r"total number of cores\s*:?\s*(\d+)|(\d+)\s*-?\s*cores?(?:\s*gpu)?|(\d+)\s*gpu\s*cores?")
SIZE_TOLERANCE = 0.03   # "80GB" names 80 GiB or 80 GB, within rounding


@dataclass(frozen=True)
class NameParts:
    """A name split into its model key and the qualifiers that may be dropped from it."""

    key: str                       # normalized, without vendor, form-factor, memory words, size or cores
    sizes: frozenset[float] = frozenset()
    cores: frozenset[int] = frozenset()
    forms: frozenset[str] = frozenset()
    memory: frozenset[str] = frozenset()

    @classmethod
    def of(cls, name: str) -> "NameParts":
        text = re.sub(r"\((?:r|tm)\)|[®™]", " ", name.lower())
        cores = {int(next(g for g in m.groups() if g)) for m in _CORES.finditer(text)}
        text = _CORES.sub(" ", text)
        sizes = {float(m[1]) for m in _SIZE.finditer(text)}
        tokens = re.findall(r"[a-z0-9]+", _SIZE.sub(" ", text))
        kept = [t for t in tokens if t not in VENDOR_WORDS and t not in FORM_FACTORS and t not in MEMORY_WORDS]
        return cls("".join(kept), frozenset(sizes), frozenset(cores),
                   frozenset(FORM_FACTORS[t] for t in tokens if t in FORM_FACTORS),
                   frozenset(t for t in tokens if t in MEMORY_WORDS))


def without_vendor(name: str) -> str:
    """The normalized name without vendor words: 'NVIDIA GeForce RTX 4090' -> 'rtx4090'."""
    return "".join(t for t in re.findall(r"[a-z0-9]+", name.lower()) if t not in VENDOR_WORDS)


def read_yaml(path: Path) -> dict:
    data = parse_yaml(read_text(path, "database file"), path)
    if not isinstance(data, dict):
        raise DatabaseError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def parse_entry(kind: type[Spec], data: dict, origin: str) -> Spec:
    try:
        return kind.model_validate(data)
    except ValidationError as exc:
        raise DatabaseError(f"{origin}: invalid {kind.__name__} entry: {describe_validation_error(exc)}") from None


@dataclass
class Registry(Generic[Spec]):
    """Entries of one kind, found by exact name, alias or id after :func:`normalize`.

    A device name that misses is tried twice more, never by a fuzzy match: without vendor words
    ("NVIDIA GeForce RTX 4090" is the alias "RTX 4090"), then also without a memory size, GPU core
    count, form factor or memory type, which must then agree with the entry (its capacity, or its own
    names): "NVIDIA B200 SXM 180GB", "Apple M2 Ultra, Total Number of Cores: 76". A name that still
    fits several entries ("A100 80GB": SXM4 and PCIe) is an error that lists them; none is picked.
    """

    kind: str
    entries: dict[str, Spec] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)
    _keys: dict[str, str] = field(default_factory=dict)
    _names: dict[str, list[str]] = field(default_factory=dict)
    _loose: dict | None = field(default=None, repr=False)

    def add(self, entry: Spec, names: Iterable[str], origin: str) -> None:
        canonical = entry.name
        names = list(names)
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
        self._names[canonical] = names
        self._loose = None

    def get(self, name: str) -> Spec:
        canonical = self._keys.get(normalize(name))
        if canonical is None:
            canonical = self._loose_match(name)
        if canonical is None:
            raise UnknownNameError(self.unknown_message(name))
        return self.entries[canonical]

    def _loose_index(self) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, list[NameParts]]]:
        if self._loose is None:
            bare, keyed, parts = {}, {}, {}
            for canonical in self.entries:
                names = [n for n in self._names.get(canonical, [canonical])
                         if self._keys.get(normalize(n)) == canonical]
                parts[canonical] = [NameParts.of(n) for n in names]
                for n, p in zip(names, parts[canonical]):
                    bare.setdefault(without_vendor(n), set()).add(canonical)
                    keyed.setdefault(p.key, set()).add(canonical)
            self._loose = {"bare": bare, "keyed": keyed, "parts": parts}
        return self._loose["bare"], self._loose["keyed"], self._loose["parts"]

    def _loose_match(self, name: str) -> str | None:
        """The one device ``name`` names once vendor words and checked qualifiers are dropped (class docstring)."""
        if not any(hasattr(e, "memory_capacity_bytes") for e in self.entries.values()):
            return None   # models: exact names only
        bare, keyed, parts = self._loose_index()
        found = bare.get(without_vendor(name), set())
        if len(found) == 1:
            return next(iter(found))
        query = NameParts.of(name)
        candidates = sorted(found or keyed.get(query.key, set()))
        fitting = [c for c in candidates if self._agrees(c, query, parts[c])]
        if len(fitting) == 1:
            return fitting[0]
        if len(fitting) > 1:
            raise UnknownNameError(f"{self.kind} name {name!r} is ambiguous: it fits {', '.join(fitting)}; "
                                   "give one of these names")
        if candidates:
            raise UnknownNameError(f"{self.kind} name {name!r} names {', '.join(candidates)} but disagrees with "
                                   f"{'its' if len(candidates) == 1 else 'their'} {self._disagreement(query)}; "
                                   f"run `roofline show {self.kind} NAME` to compare")
        return None

    def _agrees(self, canonical: str, query: NameParts, names: list[NameParts]) -> bool:
        entry = self.entries[canonical]
        sizes = set().union(*(p.sizes for p in names))
        cores = set().union(*(p.cores for p in names))
        forms = set().union(*(p.forms for p in names))
        capacity = getattr(entry, "memory_capacity_bytes", None)
        memory = getattr(getattr(entry, "memory", None), "type", None)

        def size_fits(size: float) -> bool:
            if size in sizes:
                return True
            return capacity is not None and any(abs(capacity / unit - size) <= max(0.5, SIZE_TOLERANCE * size)
                                                for unit in (2**30, 1e9))
        return (all(size_fits(s) for s in query.sizes)
                and (not query.cores or query.cores <= cores)
                and (not query.forms or not forms or query.forms <= forms)
                and (not query.memory or memory is None or {str(memory.value).lower()} >= query.memory))

    @staticmethod
    def _disagreement(query: NameParts) -> str:
        said = [f"{s:g} GB" for s in sorted(query.sizes)] + [f"{c}-core GPU" for c in sorted(query.cores)] \
            + sorted(query.forms) + sorted(query.memory)
        return "memory size, core count, form factor or memory type (" + ", ".join(said) + ")"

    def unknown_message(self, name: str) -> str:
        close_keys = difflib.get_close_matches(normalize(name), self._keys, n=8, cutoff=0.5)
        close = list(dict.fromkeys(self._keys[k] for k in close_keys))
        if any(hasattr(e, "memory_capacity_bytes") for e in self.entries.values()):
            _, keyed, _ = self._loose_index()
            for key in difflib.get_close_matches(NameParts.of(name).key, keyed, n=4, cutoff=0.75):
                close += sorted(keyed[key] - set(close))
        hint = f" Closest: {', '.join(close[:8])}." if close else ""
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
                data = load_yaml(text)
            except yaml.YAMLError as exc:
                raise DatabaseError(f"{origin}: not valid YAML: {exc}") from None
            _add(db, data, origin, builtin=True)
    for path in _user_files(Path(f) for f in folders):
        _add(db, read_yaml(path), str(path), builtin=False)
    return db
