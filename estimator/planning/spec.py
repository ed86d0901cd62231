"""`roofline plan`: which hardware, how many, in which format, and at what cost.

The inverse of an estimate. A plan names one or more models, a workload
(prompt and output length: fixed, a few request types judged one by one, or a
length mix served together; a concurrency or a request rate; a prefix-cache hit
rate), service targets and constraints; the planner estimates every
candidate (device × count × layout × format) under that load with the
vectorized sweep, keeps those that meet the targets (on the mean latencies, or
at ``targets.latency_percentile`` of the queueing model; docs/formulas.md §14),
ranks them by cost per million output tokens, marks the Pareto front of cost
against inter-token latency, and says why each other candidate was rejected.

The cost model is :mod:`estimator.planning.cost`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from estimator.errors import ConfigurationError, load_yaml_model
from estimator.serving.lengths import file_beside, length_mix

DEFAULT_FORMATS = ("bf16", "fp8", "int4-awq", "nvfp4")
FP4_FORMATS = ("nvfp4", "mxfp4", "mxfp4-experts")
MAX_DEVICES = 1024        # the largest deployment a plan searches
MAX_COUNT = 10**9         # tokens and requests in flight: far beyond any deployment


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Request(_Spec):
    prompt: int = Field(ge=1, le=MAX_COUNT, description="prompt tokens")
    output: int = Field(ge=1, le=MAX_COUNT, description="output tokens")
    share: float = Field(default=1.0, gt=0, description="share of requests (a mix's weights need not sum to 1)")


class Workload(_Spec):
    prompt: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    output: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    mix: list[Request] = Field(default_factory=list, description="instead of prompt/output: a few request types, "
                                                                 "each judged as if it were the only one")
    lengths: str | None = Field(
        default=None, max_length=4096, description="instead of prompt/output: request lengths served together, from a "
                                                   "preset (chat, sharegpt, rag, reasoning, random), a preset at "
                                                   "other means (sharegpt@229/217) or a CSV of prompt,output per "
                                                   "request (docs/formulas.md §14, 'Request lengths')")
    concurrency: int = Field(default=0, ge=0, le=MAX_COUNT, description="requests in flight (closed loop)")
    rate: float = Field(default=0.0, ge=0, description="requests per second (open loop)")
    max_num_seqs: int | None = Field(default=None, ge=1, le=MAX_COUNT,
                                     description="the engine's cap on running sequences (None: its profile's)")
    prefix_hit_rate: float = Field(default=0.0, ge=0, le=1, description="share of prompt tokens found in the "
                                                                        "engine's prefix cache")

    @field_validator("lengths")
    @classmethod
    def _known_lengths(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A preset, or a file of requests: beside the plan file that names it (as `predict` finds one beside its
        CSV), else as given."""
        if value is None:
            return None
        beside = file_beside(value, (info.context or {}).get("folder", "."))
        if Path(beside).is_file():
            value = beside
        try:
            length_mix(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        return value

    @model_validator(mode="after")
    def _one_of_each(self) -> "Workload":
        if bool(self.concurrency) == bool(self.rate):
            raise ValueError("give exactly one of workload.concurrency and workload.rate")
        given = [name for name, on in (("prompt/output", self.prompt or self.output), ("mix", self.mix),
                                       ("lengths", self.lengths)) if on]
        if len(given) > 1:
            raise ValueError(f"give one of workload.prompt/output, workload.mix and workload.lengths, not "
                             f"{' and '.join(given)}")
        if not (self.mix or self.lengths or (self.prompt and self.output)):
            raise ValueError("workload needs prompt and output (or a mix, or lengths)")
        return self

    @property
    def requests(self) -> list[Request]:
        """The request types judged one by one; a length mix is one, at its mean lengths (whole tokens)."""
        if self.lengths:
            mix = length_mix(self.lengths)
            return [Request(prompt=max(round(mix.mean_prompt_tokens), 1),
                            output=max(round(mix.mean_output_tokens), 1))]
        return self.mix or [Request(prompt=self.prompt, output=self.output)]

    @property
    def serving(self) -> dict:
        """The serving options every estimate of the plan runs under (estimate's keywords)."""
        return {"concurrency": self.concurrency, "rate": self.rate, "max_num_seqs": self.max_num_seqs,
                "lengths": self.lengths, "prefix_hit_rate": self.prefix_hit_rate}


class Targets(_Spec):
    max_ttft_s: float | None = Field(default=None, gt=0, description="TTFT at most, seconds, queueing included")
    min_tps_per_user: float | None = Field(default=None, gt=0, description="decode tokens/s per user at least")
    percentile: Literal["p50", "p90"] = Field(
        default="p50", description="p90: judge the pessimistic end of the 80% interval, not the estimate")
    latency_percentile: Literal["p50", "p90", "p99"] | None = Field(
        default=None, description="judge TTFT and per-user tokens/s (1 / ITL) at this percentile of the queueing "
                                  "model under the load, not the means (docs/formulas.md §14)")


class Constraints(_Spec):
    formats: list[str] | None = None
    min_bits: float | None = Field(default=None, gt=0, le=32, description="only formats with at least this many bits")
    gpus: list[str] | None = Field(default=None, description="device names, or classes like datacenter_gpu")
    max_gpus: int = Field(default=8, ge=1, le=MAX_DEVICES)
    devices_per_node: int = Field(default=8, ge=1, le=MAX_DEVICES)
    deployment: Literal["cloud", "on_prem"] = "cloud"
    budget_usd: float | None = Field(default=None, gt=0, description="purchase (on_prem) or per month (cloud)")


class DevicePrice(_Spec):
    purchase_usd: float | None = Field(default=None, gt=0)
    cloud_usd_per_hour: float | None = Field(default=None, gt=0)


class Prices(_Spec):
    devices: dict[str, DevicePrice] = Field(default_factory=dict, description="overrides by device name")
    energy_usd_per_kwh: float = Field(default=0.12, ge=0)
    utilization: float = Field(default=0.7, gt=0, le=1, description="average power draw as a share of TDP")
    pue: float = Field(default=1.3, ge=1, description="data-centre power usage effectiveness")
    amortization_years: float = Field(default=3.0, gt=0)


class PlanSpec(_Spec):
    """A plan file (`roofline plan plan.yaml`); the CLI flags build the same object."""

    models: list[str] = Field(min_length=1)
    workload: Workload
    targets: Targets = Targets()
    constraints: Constraints = Constraints()
    prices: Prices = Prices()
    engine: str = Field(default="vLLM", description="serving-engine profile")


def load_plan(path) -> PlanSpec:
    """Read a plan YAML; an unknown or bad key is an error naming it. A lengths file is read beside the plan."""
    return load_yaml_model(path, PlanSpec, "plan", ConfigurationError, context={"folder": Path(path).parent})
