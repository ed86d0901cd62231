"""The published-measurements dataset shipped in ``measurements_db/`` (one CSV per collection).

Every collection has the columns of ``measurements_db/SCHEMA.md``; a file that lacks one, or a row
with a value outside what the schema accepts, is a database error naming the file and the row.
"""

from __future__ import annotations

import csv
import difflib
import io
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from estimator.efficiency.engine_profiles import BACKENDS, engine_of_measurement
from estimator.errors import DatabaseError, UnknownNameError
from estimator.validation.metrics import METRICS

COLUMNS = ("id", "source", "url", "framework", "engine", "engine_version", "backend", "date", "hardware", "n_gpus",
           "tp", "model", "params_b", "active_params_b", "weight_format", "kv_format", "batch", "concurrency",
           "request_rate", "input_len", "output_len", "context_depth", "attention", "gpu_layers", "cpu_moe", "n_ubatch",
           "metric", "statistic", "value", "unit", "notes")
# The optional columns of measurements_db/SCHEMA.md: read by `roofline predict`, and by validation where a collection
# has them
OPTIONAL_COLUMNS = ("pp", "ep", "dp", "attention_dp", "runtime", "memory_gib", "max_num_seqs", "prefix_hit_rate",
                    "lengths", "calibration", "num_requests", "token_ids")
SCHEMA_COLUMNS = (*COLUMNS, *OPTIONAL_COLUMNS)
STATISTICS = ("", "mean", "median", "p90", "p99")
# Synthetic token ids a benchmark fed instead of text (the optional ``token_ids`` column): llama-batched-bench fed
# token 0 everywhere before August 2025 and random ids since (docs/formulas.md §9)
TOKEN_IDS = ("", "repeated", "random")
DATE = re.compile(r"^(|\d{4}-\d{2}(-\d{2})?)$")
REPOSITORY_PATH = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*/?")
# Rows their collector flagged as doubtful (far out of line with the same GPU's other results, or read
# from a single unconfirmed transcription) stay in the dataset for the record but are left out of
# fitting and of the reported error.
DOUBT_MARKS = ("SUSPECT", "UNVERIFIED")


@dataclass(frozen=True)
class Dataset:
    rows: list[dict]
    files: list[str]

    @property
    def sources(self) -> list[str]:
        return sorted({r["source"] for r in self.rows})

    def usable(self) -> list[dict]:
        """Rows for fitting and error figures: a positive value, not flagged as doubtful."""
        return [r for r in self.rows
                if not any(mark in r.get("notes", "") for mark in DOUBT_MARKS) and _positive(r.get("value"))]


def _positive(text) -> bool:
    try:
        return float(text) > 0
    except (TypeError, ValueError):
        return False


def load_dataset() -> Dataset:
    """Every CSV in measurements_db, checked for its columns, unique ids, a URL and a known metric."""
    rows, files, seen = [], [], set()
    folder = resources.files("measurements_db")
    for path in sorted(p for p in folder.iterdir() if p.name.endswith(".csv")):
        reader = csv.DictReader(io.StringIO(path.read_text()))
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise DatabaseError(f"measurements_db/{path.name}: missing columns {missing}")
        if unknown := unknown_columns(reader.fieldnames):
            raise DatabaseError(f"measurements_db/{path.name}: {unknown}")
        for row in reader:
            problem = _row_problem(row, seen) or _file_problem(row, folder, "calibration") \
                or _file_problem(row, folder, "lengths", ".csv")
            if problem:
                raise DatabaseError(f"measurements_db/{path.name}, row {row.get('id')!r}: {problem}")
            seen.add(row["id"])
            # "folder": where the row's relative paths (its calibration profile) are read from
            rows.append({**row, "file": path.name, "folder": str(folder)})
        files.append(path.name)
    return Dataset(rows, files)


def unknown_columns(names) -> str:
    """The header's columns the schema does not name, in words ('' when there are none), each with the nearest
    schema column where one is close: a misspelt 'concurency' would otherwise be ignored and its rows run with no
    load. Empty names (a header's trailing comma) carry nothing and pass."""
    unknown = [n for n in names or () if n and n not in SCHEMA_COLUMNS]
    if not unknown:
        return ""
    named = ", ".join(repr(n) + "".join(f" (did you mean {m!r}?)"
                                        for m in difflib.get_close_matches(n, SCHEMA_COLUMNS, n=1, cutoff=0.75))
                      for n in unknown)
    return (f"unknown column{'s' if len(unknown) > 1 else ''} {named}; the columns are those of "
            f"measurements_db/SCHEMA.md: {', '.join(SCHEMA_COLUMNS)}")


def _cites_source(url: str) -> bool:
    """A web address, or for a row this project measured, the repository folder or file its raw output was
    committed in (a relative path such as benchmarks/results/h200-2026-11-30/)."""
    return url.startswith("http") or (REPOSITORY_PATH.fullmatch(url) is not None and ".." not in url)


def _file_problem(row: dict, folder, column: str, suffix: str = "") -> str | None:
    """A file a row cites (its ``calibration`` profile, its run's ``lengths`` when that names a CSV) must be a file
    of the collection's folder, named by a relative path (the dataset is read wherever the package is installed)."""
    name = row.get(column) or ""
    if name and name.endswith(suffix) and (name.startswith("/") or ".." in name or not folder.joinpath(name).is_file()):
        return f"{column} {name!r} is not a file under measurements_db/"
    return None


# Columns whose cell is one of a few words (or empty)
ENUMERATED_COLUMNS = (("backend", ("", *BACKENDS)), ("statistic", STATISTICS), ("token_ids", TOKEN_IDS))


def enumerated_problem(row: dict) -> str | None:
    """The first of ``ENUMERATED_COLUMNS`` whose cell is none of its words, in words; None when all are."""
    for key, allowed in ENUMERATED_COLUMNS:
        if (row.get(key) or "") not in allowed:
            return f"{key} {row.get(key)!r} is not one of {', '.join(a for a in allowed if a)} (or empty)"
    return None


def _row_problem(row: dict, seen: set) -> str | None:
    if not row.get("id") or row["id"] in seen:
        return "missing or duplicate id"
    if not _cites_source(row.get("url") or ""):
        return "no source URL"
    if row.get("metric") not in METRICS:
        return f"unknown metric {row.get('metric')!r}"
    if not row.get("source"):
        return "no source id"
    if problem := enumerated_problem(row):
        return problem
    if not DATE.match(row.get("date", "")):
        return f"date {row.get('date')!r} is not YYYY-MM or YYYY-MM-DD"
    name = row.get("engine") or ""
    # the framework text picks the profile only where the engine cell names none: key the cache on it only then
    framework = (row.get("framework") or "") if name.lower() in ("", "other") else ""
    return _engine_problem(name, row.get("runtime") or "", framework)


@lru_cache(maxsize=None)
def _engine_problem(name: str, runtime: str, framework: str) -> str | None:
    """An ``engine`` cell names a profile (``predict`` refuses a row whose cell does not), or is empty or
    ``other`` (the ``framework`` text then picks the profile), and a ``runtime`` cell is one that profile has; once
    per distinct triple, not per row."""
    try:
        profile = engine_of_measurement(name, framework)
    except UnknownNameError:
        return f"engine {name!r} names no profile in engines_db/ (empty or 'other': the framework text picks one)"
    try:
        profile.runtime_of(runtime=runtime)
    except UnknownNameError as exc:
        return str(exc)
    return None
