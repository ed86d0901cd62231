"""Errors a user can cause; each message says what was wrong and what to do."""

from __future__ import annotations


class RooflineError(Exception):
    """Base class: the CLI prints these as ``Name: message`` and exits 1."""


class UnknownNameError(RooflineError, KeyError):
    """A GPU, model or format name that matches no entry; the message lists the closest names."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class DatabaseError(RooflineError):
    """A database file that does not parse or does not validate."""


class ConfigurationError(RooflineError):
    """A workload or system that cannot exist (zero batch, more tensor-parallel ranks than heads ...)."""


class DoesNotFitError(RooflineError):
    """A model that does not fit; the message says how much memory it needs and has."""


def describe_validation_error(exc) -> str:
    """A pydantic ValidationError as 'field.path: message; ...', naming each bad field."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top level)'}: {e['msg']}" for e in exc.errors())


def load_yaml_model(path, model, what: str, error=None):
    """Read a YAML file into a pydantic ``model``; a missing file, bad YAML or bad field is ``error``."""
    from pathlib import Path

    import yaml
    from pydantic import ValidationError

    error = error or DatabaseError
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise error(f"cannot read {what} {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: not valid YAML: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise error(f"{path}: not a valid {what}: {describe_validation_error(exc)}") from None
