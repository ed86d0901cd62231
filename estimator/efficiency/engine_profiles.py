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
from pydantic import Field, ValidationError, model_validator

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


SchedulingKey = Literal["prefill_runs_alone", "prefill_chunk_tokens", "graphed_prefill_tokens",
                        "blocking_output_per_sequence_s", "sampler_warmup_bytes_per_logit"]


class Runtime(Frozen):
    """An execution path the engine offers beside the one its profile describes, where it schedules its steps or
    budgets its memory differently (vLLM's V0 engine beside V1; TensorRT-LLM's built TensorRT engines beside its
    PyTorch backend). Only such properties: the fitted efficiencies stay one set across runtimes (docs/formulas.md
    §12.10)."""

    scheduling: dict[SchedulingKey, bool | int | float | None] = Field(
        description="EngineDefaults values this runtime runs with")
    scheduler: SchedulerDefaults | None = Field(
        default=None, description="its own default cap on running sequences, where it is not the profile's")
    source: str


class Release(Frozen):
    """The runtime the engine's releases before ``before`` ran by default, where it is not the one the profile
    describes (vLLM before 0.8.0: its V0 engine)."""

    before: str = Field(pattern=r"^\d+(\.\d+)*$", description="the first release that no longer behaves so")
    runtime: str = Field(description="a key of the profile's runtimes")
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
    runtime: str | None = Field(
        default=None, description="the name of the execution path the parameters describe, where the engine has "
                                  "others (runtimes)")
    runtimes: dict[str, Runtime] = Field(
        default_factory=dict, description="other execution paths, by name, where they schedule differently")
    releases: list[Release] = Field(
        default_factory=list, description="older releases whose default runtime was another, the oldest last")
    fit: FitRecord | None = None
    notes: str | None = None

    @model_validator(mode="after")
    def _runtimes_named(self):
        unknown = sorted({r.runtime for r in self.releases} - set(self.runtimes))
        if unknown:
            raise ValueError(f"releases name runtimes the profile does not list: {unknown}")
        if self.runtimes and (not self.runtime or self.runtime in self.runtimes):
            raise ValueError("a profile with other runtimes names its own (runtime), not among them")
        return self

    @property
    def runtime_names(self) -> tuple[str, ...]:
        """The execution paths a run may name: the profile's own first, then its other runtimes."""
        return tuple(n for n in (self.runtime, *self.runtimes) if n)

    def runtime_of(self, engine_version: str = "", runtime: str = "") -> str:
        """The runtime a run used: ``runtime`` when stated (the profile's own or one of its runtimes, else
        UnknownNameError), else the default of release ``engine_version`` (the current release's when it is
        unstated or names no release)."""
        if runtime:
            key = runtime.strip().lower()
            if key not in self.runtime_names:
                raise UnknownNameError(f"unknown runtime {runtime!r} for {self.name}: known "
                                       f"{', '.join(self.runtime_names) or 'none'}")
            return key
        version = release_of(engine_version)
        covering = [r for r in self.releases if version is not None and r.covers(version)]
        return min(covering, key=lambda r: _release_key(r.before)).runtime if covering else (self.runtime or "")

    def _other_runtime(self, engine_version: str, runtime: str) -> Runtime | None:
        """The entry of ``runtimes`` a run used (:meth:`runtime_of`); None for the profile's own runtime."""
        return self.runtimes.get(self.runtime_of(engine_version, runtime))

    def scheduling_at(self, engine_version: str = "", runtime: str = "") -> tuple[tuple[str, object], ...]:
        """The scheduling properties a run used where they differ from the profile's (as sorted pairs, to key
        groups of rows by): its runtime's; none for the profile's own runtime."""
        chosen = self._other_runtime(engine_version, runtime)
        return tuple(sorted(chosen.scheduling.items())) if chosen else ()

    def scheduler_at(self, engine_version: str = "", runtime: str = "") -> SchedulerDefaults | None:
        """The default cap on running sequences a run had: its runtime's where that has its own (vLLM's V0 engine:
        256 on every device), else the profile's."""
        chosen = self._other_runtime(engine_version, runtime)
        return chosen.scheduler if chosen and chosen.scheduler else self.scheduler

    def as_run(self, suffix: str) -> "EngineProfile":
        """The profile as a release (``vLLM@0.7.3``) or a named runtime (``TensorRT-LLM@tensorrt``) runs:
        ``name@suffix``, its scheduling and default cap where they differ. A runtime's name (``v0``) is never read
        as a release."""
        by_release = suffix.strip().lower() not in self.runtime_names and release_of(suffix) is not None
        version, runtime = (suffix, "") if by_release else ("", suffix)
        scheduling = dict(self.scheduling_at(version, runtime))
        return self.model_copy(update={"name": f"{self.name}{BACKEND_MARK}{suffix}",
                                       "parameters": self.parameters.model_copy(update=scheduling),
                                       "scheduler": self.scheduler_at(version, runtime)})

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


# llama.cpp@vulkan: on a named backend; vLLM@0.7.3: as that release ran; TensorRT-LLM@tensorrt: on a runtime
BACKEND_MARK = "@"
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
    """An engine by name or alias, optionally on a backend (``llama.cpp@vulkan``), as a release ran (``vLLM@0.7.3``:
    the default runtime of the profile's ``releases`` that covers it) or on a named runtime
    (``TensorRT-LLM@tensorrt``)."""
    base, suffix = split_engine_name(name)
    key = normalize(base)
    for profile in load_engines():
        if key in {normalize(profile.name), *map(normalize, profile.aliases)}:
            if release_of(suffix) or suffix in profile.runtime_names:
                return profile.as_run(suffix)
            if BACKEND_MARK in name and suffix not in BACKENDS:
                runtimes = f" or a runtime ({', '.join(profile.runtime_names)})" if profile.runtime_names else ""
                raise UnknownNameError(f"unknown engine backend {suffix!r} in {name!r}: after {BACKEND_MARK} give a "
                                       f"backend ({', '.join(BACKENDS)}), a release number (vLLM@0.7.3){runtimes}.")
            return profile.on_backend(suffix)
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

