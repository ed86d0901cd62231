"""Serving-engine profiles: the parameters that differ between engines, as data.

One YAML file per engine in ``engines_db/``. A profile holds the engine's
kernel efficiencies and fixed costs (an :class:`EngineDefaults`), how it spreads
a model over several GPUs (llama.cpp splits layers, a pipeline; vLLM, SGLang and
TensorRT-LLM use tensor parallelism), which ``framework`` strings of a
measurement name it, and, once fitted, where the fit came from. The parameters
are global per engine (across devices and models) and fitted by
:mod:`estimator.validation.fitting` from the published dataset.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import yaml
from pydantic import Field, ValidationError

from estimator.efficiency.defaults import EngineDefaults
from estimator.errors import DatabaseError, UnknownNameError
from estimator.specs.database import normalize
from estimator.specs.sourced import Frozen


class FitRecord(Frozen):
    """Where fitted parameters came from."""

    dataset_rows: int = Field(ge=0)
    sources: list[str]
    date: str
    loso_median_abs_error: dict[str, float] = Field(default_factory=dict, description="by metric, cross-validated")


class EngineProfile(Frozen):
    name: str
    aliases: list[str] = Field(default_factory=list)
    match: list[str] = Field(description="case-insensitive substrings of a measurement's `framework` column")
    multi_gpu: str = Field(default="tensor", pattern="^(tensor|layers)$", description="how N devices split a model")
    parameters: EngineDefaults
    fit: FitRecord | None = None
    notes: str | None = None


INTERVALS_FILE = "_intervals.yaml"   # written by `roofline validate --published --write`


@lru_cache(maxsize=1)
def load_intervals() -> dict | None:
    """The calibrated prediction intervals, when a validation run has written them."""
    path = resources.files("engines_db").joinpath(INTERVALS_FILE)
    return yaml.safe_load(path.read_text()) if path.is_file() else None


@lru_cache(maxsize=1)
def load_engines() -> tuple[EngineProfile, ...]:
    """Every profile in engines_db (the generic one last, as the fallback)."""
    profiles = []
    for path in sorted(p for p in resources.files("engines_db").iterdir()
                       if p.name.endswith(".yaml") and not p.name.startswith("_")):
        try:
            profiles.append(EngineProfile.model_validate(yaml.safe_load(path.read_text())))
        except (yaml.YAMLError, ValidationError) as exc:
            raise DatabaseError(f"engines_db/{path.name}: invalid engine profile:\n{exc}") from None
    return tuple(sorted(profiles, key=lambda p: p.name == "generic"))


def engine(name: str) -> EngineProfile:
    """An engine by name or alias."""
    key = normalize(name)
    for profile in load_engines():
        if key in {normalize(profile.name), *map(normalize, profile.aliases)}:
            return profile
    raise UnknownNameError(f"unknown engine {name!r}. Known: {', '.join(p.name for p in load_engines())}.")


def engine_for_framework(framework: str) -> EngineProfile:
    """The engine a measurement's free-text ``framework`` names; the generic profile when none matches."""
    text = (framework or "").lower()
    for profile in load_engines():
        if any(token.lower() in text for token in profile.match):
            return profile
    return engine("generic")

