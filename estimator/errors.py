"""Errors a user can cause, and the edge where files are read and written.

Each message is one line that says what was wrong (the input, its value) and what
is accepted. Files are read as UTF-8 text with a clear error, and outputs are
written atomically, never over an existing file without ``--force``.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Callable


class RooflineError(Exception):
    """Base class: the CLI prints the message alone, on one line, and exits 2."""


class UnknownNameError(RooflineError, KeyError):
    """A GPU, model or format name that matches no entry; the message lists the closest names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DatabaseError(RooflineError):
    """A database file that does not parse or does not validate."""


class ConfigurationError(RooflineError):
    """A workload or system that cannot exist (zero batch, more tensor-parallel ranks than heads ...)."""


def _shown(value) -> str:
    """A short rendering of an offending value (containers are named by the field path instead)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe_validation_error(exc) -> str:
    """A pydantic ValidationError as 'field.path = value: message; ...', naming each bad field."""
    parts = []
    for e in exc.errors():
        where = ".".join(map(str, e["loc"])) or "(top level)"
        value = e.get("input")
        shown = "" if isinstance(value, (dict, list, tuple)) or "input" not in e else f" = {_shown(value)}"
        parts.append(f"{where}{shown}: {e['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)


def read_text(path, what: str, error=None) -> str:
    """The contents of a UTF-8 text file; a missing, unreadable or binary file is ``error``."""
    error = error or DatabaseError
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path} is not UTF-8 text (byte {exc.start}); give a text file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise error(f"cannot read {what} {path}: {getattr(exc, 'strerror', None) or exc}") from None


def _non_finite_field(data, where: str = "") -> str | None:
    """The path of the first NaN or infinite number in parsed YAML/JSON data, or None."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "(top level)"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = _non_finite_field(value, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def _yaml_problem(exc) -> str:
    mark = getattr(exc, "problem_mark", None)
    place = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    return f"{getattr(exc, 'problem', None) or 'cannot parse'}{place}"


def load_yaml(text: str):
    """YAML's safe subset, parsed by libyaml where PyYAML was built with it, else by its pure-Python parser: the
    same documents, 8x sooner (the 230 database files: 0.56 s against 4.6 s, most of a command's start-up)."""
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def parse_yaml(text: str, origin, error=None):
    """Parsed YAML; a syntax error, or a NaN or infinite number anywhere, is ``error`` naming ``origin``."""
    import yaml

    error = error or DatabaseError
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise error(f"{origin}: not valid YAML: {_yaml_problem(exc)}") from None
    try:
        bad = _non_finite_field(data)
    except RecursionError:   # an alias that contains itself, or absurd nesting
        raise error(f"{origin}: nests too deeply or refers to itself (a YAML alias inside its own anchor)") \
            from None
    if bad:
        raise error(f"{origin}: {bad} is not a finite number; give a number (YAML .inf and .nan are not accepted)")
    return data


def load_yaml_model(path, model, what: str, error=None, context: dict | None = None):
    """Read a YAML file into a pydantic ``model`` (its validators see ``context``); a missing file, bad YAML or bad
    field is ``error``."""
    from pydantic import ValidationError

    error = error or DatabaseError
    data = parse_yaml(read_text(path, what, error), path, error)
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise error(f"{path}: not a valid {what}: {describe_validation_error(exc)}") from None


def prepare_output(path, force: bool, flag: str) -> Path:
    """Check an output path before any work is done, and create its folder.

    It must name a file, not a folder, and may be an existing file only with ``--force``.
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise ConfigurationError(f"{flag} {path} is a folder; give a file name")
        if path.exists() and not force:
            raise ConfigurationError(f"{flag} {path} exists; pass --force to overwrite it, or choose another {flag}")
        path.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        raise ConfigurationError(f"{flag} {path}: cannot write there ({getattr(exc, 'strerror', None) or exc})") \
            from None
    return path


def write_atomically(path, write: Callable[[Path], None], force: bool, flag: str) -> Path:
    """Call ``write(temporary_path)``, then rename the file onto ``path``: a reader never sees half a file."""
    path = prepare_output(path, force, flag)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    except OSError as exc:
        raise ConfigurationError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
    return path
