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
