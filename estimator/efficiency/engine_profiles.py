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

import re
from functools import lru_cache
from importlib import resources
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from estimator.efficiency.defaults import EngineDefaults
from estimator.errors import DatabaseError, UnknownNameError, load_yaml
from estimator.specs.database import normalize
from estimator.specs.formats import WeightFormat
from estimator.specs.model import ModelSpec
from estimator.specs.sourced import Frozen


class FittedParameter(Frozen):
    """One fitted parameter: its value, the physical bounds it was fitted within, and its standard error."""

    value: float
    lower: float
    upper: float
    stderr: float | None = Field(default=None, description="from the fit's Jacobian; None when not identified")
    on_bound: bool = Field(description="True when the fit ended on a bound: a mechanism is missing")
    inherited: bool = Field(default=False, description="held at the parent engine's fitted value, not fitted "
                                                       "(a backend variant's KV-cache product)")
    identified: bool = Field(default=True, description="False: no row depends on it, so the prior and the pull "
                                                       "between device groups set it (no standard error)")


class FitRecord(Frozen):
    """Where fitted parameters came from."""

    dataset_rows: int = Field(ge=0)
    sources: list[str]
    date: str
    loso_median_abs_error: dict[str, float] = Field(default_factory=dict, description="by metric, cross-validated")
    parameters: dict[str, FittedParameter] = Field(default_factory=dict)


class BackendVariant(Frozen):
    """An engine's parameters on a backend whose kernels differ from its primary ones (llama.cpp on ROCm)."""

    parameters: EngineDefaults
    fit: FitRecord | None = None


class SchedulerDefaults(Frozen):
    """The engine's own cap on the sequences one step runs when the user sets none (vLLM ``max_num_seqs``)."""

    max_num_seqs: int | None = Field(default=None, ge=1, description="None: only the KV cache limits the batch")
    large_device_max_num_seqs: int | None = Field(default=None, ge=1, description="the cap on large devices")
    large_device_min_gib: float | None = Field(default=None, gt=0, description="device memory (GiB) from which "
                                                                               "a device counts as large")
    large_device_excluded: list[str] = Field(default_factory=list, description="name substrings never large")
    source: str

    def max_num_seqs_on(self, hardware) -> float:
        """The cap on ``hardware`` (inf when the engine has none)."""
        large = (self.large_device_max_num_seqs is not None and self.large_device_min_gib is not None
                 and hardware.memory_capacity_bytes >= self.large_device_min_gib * 2**30
                 and not any(x in hardware.name.lower() for x in self.large_device_excluded))
        cap = self.large_device_max_num_seqs if large else self.max_num_seqs
        return float("inf") if cap is None else float(cap)


class Release(Frozen):
    """How the engine's releases before ``before`` scheduled their steps, where that differs from the current
    release the profile describes (vLLM's V0 engine, the default before 0.8.0). Only scheduling properties: the
    fitted efficiencies stay one set across releases (docs/formulas.md §12.10)."""

    before: str = Field(pattern=r"^\d+(\.\d+)*$", description="the first release that no longer behaves so")
    scheduling: dict[Literal["prefill_runs_alone", "prefill_chunk_tokens", "graphed_prefill_tokens"],
                     bool | int | None] = Field(
        description="EngineDefaults values those releases ran with")
    source: str

    def covers(self, version: tuple[int, ...]) -> bool:
        return version < _release_key(self.before)


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def release_of(engine_version: str) -> tuple[int, ...] | None:
    """The numeric release an ``engine_version`` cell starts with (``0.7.3.dev138+g21f6ca217`` -> (0, 7, 3));
    None when it names none (empty, a container tag such as ``NGC 25.09``)."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", engine_version or "")
    return _release_key(match.group(1)) if match else None


class EngineProfile(Frozen):
    name: str
    aliases: list[str] = Field(default_factory=list)
    match: list[str] = Field(description="case-insensitive substrings of a measurement's `framework` column")
    multi_gpu: str = Field(default="tensor", pattern="^(tensor|layers)$", description="how N devices split a model")
    parameters: EngineDefaults
    primary_backends: list[str] = Field(
        default_factory=lambda: ["cuda"], description="backends the main parameters describe; any other backend "
                                                      "is a variant, fitted on its own rows")
    backends: dict[str, BackendVariant] = Field(default_factory=dict, description="fitted variants by backend")
    scheduler: SchedulerDefaults | None = Field(
        default=None, description="default scheduler limits; None: the engine documents no fixed cap")
    compute_dtypes: list[str] | None = Field(
        default=None, description="the math dtypes the engine's kernels use; a format whose preferred compute "
                                  "dtype is not among them falls back to the next it allows (None: any)")
    full_cache_architectures: list[str] = Field(
        default_factory=list, description="model architectures (config.json model_type) whose implementation in "
                                          "this engine gives every layer the whole KV cache: their sliding windows "
                                          "bound neither the cache nor its reads")
    releases: list[Release] = Field(
        default_factory=list, description="older releases that scheduled differently, the oldest last")
    fit: FitRecord | None = None
    notes: str | None = None

    def scheduling_at(self, engine_version: str) -> tuple[tuple[str, object], ...]:
        """The scheduling properties release ``engine_version`` ran with where they differ from the profile's
        (as sorted pairs, to key groups of rows by); none for the current release or an unstated one."""
        version = release_of(engine_version)
        covering = [r for r in self.releases if version is not None and r.covers(version)]
        return tuple(sorted(min(covering, key=lambda r: _release_key(r.before)).scheduling.items())) if covering \
            else ()

    def as_released(self, engine_version: str) -> "EngineProfile":
        """The profile as release ``engine_version`` ran: ``name@version``, its scheduling where it differs."""
        scheduling = dict(self.scheduling_at(engine_version))
        return self.model_copy(update={"name": f"{self.name}{BACKEND_MARK}{engine_version}",
                                       "parameters": self.parameters.model_copy(update=scheduling)})

    def runs(self, fmt: WeightFormat) -> WeightFormat:
        """The format as this engine computes it: its compute dtypes limited to those the kernels have."""
        if self.compute_dtypes is None:
            return fmt
        usable = tuple(d for d in fmt.compute_dtypes if d in self.compute_dtypes)
        if "fp32" in self.compute_dtypes and "fp32" not in usable:   # every device has an fp32 peak
            usable += ("fp32",)
        return fmt if usable == fmt.compute_dtypes else fmt.model_copy(update={"compute_dtypes": usable})

    def runs_model(self, model: ModelSpec) -> ModelSpec:
        """The model as this engine runs it: without its sliding windows where the engine's implementation of its
        architecture keeps every layer's whole cache (``full_cache_architectures``; docs/formulas.md §9)."""
        if model.architecture not in self.full_cache_architectures or not model.shape.sliding_window:
            return model
        return model.model_copy(update={"shape": model.shape.model_copy(
            update={"sliding_window": None, "num_local_layers": 0, "num_kv_shared_local_layers": 0})})

    def implementation_notes(self, model: ModelSpec) -> list[str]:
        """What this engine's own implementation changes in ``model`` (:meth:`runs_model`, and attention by hand
        for soft-capped scores), in words."""
        notes = []
        if self.runs_model(model) is not model:
            notes.append(f"{self.name} gives every layer of {model.architecture} models the whole KV cache: "
                         f"{model.name}'s {model.shape.sliding_window}-token sliding window bounds neither its cache "
                         "nor its reads (docs/formulas.md §9)")
        s, p = model.shape, self.parameters
        if not p.attention_fused(True, s.attention_logit_softcap is not None):
            g = s.num_attention_heads // s.num_kv_heads
            reads = f", reading the KV cache {g} times a step (once per query head)" \
                if p.broadcasts_grouped_kv and g > 1 and s.mla is None else ""
            notes.append(f"{self.name}'s fused attention cannot soft-cap scores, so it attends to {model.name}'s "
                         "capped scores by hand: unfused, with the cap's and the softmax's kernels passing over the "
                         f"scores{reads} (docs/formulas.md §13)")
        return notes

    def on_backend(self, backend: str) -> "EngineProfile":
        """The profile as it runs on ``backend``: ``name@backend`` with that variant's parameters.

        A backend without a fitted variant keeps the main parameters (the best guess there is), and
        its name says which backend was asked for.
        """
        if not backend or backend in self.primary_backends:
            return self
        variant = self.backends.get(backend)
        return self.model_copy(update={"name": f"{self.name}{BACKEND_MARK}{backend}",
                                       "parameters": variant.parameters if variant else self.parameters,
                                       "fit": variant.fit if variant else None})


BACKEND_MARK = "@"   # llama.cpp@vulkan: an engine on a named backend; vLLM@0.7.3: as that release ran
BACKENDS = ("cuda", "rocm", "metal", "vulkan", "sycl", "cpu")   # the backends a profile's variants may name


INTERVALS_FILE = "_intervals.yaml"   # written by `roofline validate --published --write`


@lru_cache(maxsize=1)
def load_intervals() -> dict | None:
    """The calibrated prediction intervals, when a validation run has written them."""
    path = resources.files("engines_db").joinpath(INTERVALS_FILE)
    return load_yaml(path.read_text()) if path.is_file() else None


@lru_cache(maxsize=1)
def load_engines() -> tuple[EngineProfile, ...]:
    """Every profile in engines_db (the generic one last, as the fallback)."""
    profiles = []
    for path in sorted(p for p in resources.files("engines_db").iterdir()
                       if p.name.endswith(".yaml") and not p.name.startswith("_")):
        try:
            profiles.append(EngineProfile.model_validate(load_yaml(path.read_text())))
        except (yaml.YAMLError, ValidationError) as exc:
            raise DatabaseError(f"engines_db/{path.name}: invalid engine profile:\n{exc}") from None
    return tuple(sorted(profiles, key=lambda p: p.name == "generic"))


def split_engine_name(name: str) -> tuple[str, str]:
    """``llama.cpp@vulkan`` -> ("llama.cpp", "vulkan"); a name without a backend -> (name, "")."""
    base, _, backend = name.partition(BACKEND_MARK)
    return base, backend.strip().lower()


def engine(name: str) -> EngineProfile:
    """An engine by name or alias, optionally on a backend (``llama.cpp@vulkan``) or as a release ran
    (``vLLM@0.7.3``: the scheduling of the profile's ``releases`` that covers it)."""
    base, backend = split_engine_name(name)
    key = normalize(base)
    for profile in load_engines():
        if key in {normalize(profile.name), *map(normalize, profile.aliases)}:
            if release_of(backend):
                return profile.as_released(backend)
            if BACKEND_MARK in name and backend not in BACKENDS:
                raise UnknownNameError(f"unknown engine backend {backend!r} in {name!r}: after {BACKEND_MARK} give a "
                                       f"backend ({', '.join(BACKENDS)}) or a release number (vLLM@0.7.3).")
            return profile.on_backend(backend)
    raise UnknownNameError(f"unknown engine {name!r}. Known: {', '.join(p.name for p in load_engines())}; "
                           f"add {BACKEND_MARK}BACKEND ({', '.join(BACKENDS)}) to pick a backend.")


def engine_of_measurement(engine_cell: str, framework: str) -> EngineProfile:
    """The engine a measurement names: its ``engine`` cell (as :func:`engine` takes it, so a name no profile has
    raises UnknownNameError), or, when that is empty or ``other``, the profile its free-text ``framework`` names
    (the generic one when none matches)."""
    if engine_cell and engine_cell.lower() != "other":
        return engine(engine_cell)
    text = (framework or "").lower()
    for profile in load_engines():
        if any(token.lower() in text for token in profile.match):
            return profile
    return engine("generic")

