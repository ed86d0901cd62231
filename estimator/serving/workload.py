"""The workload and the deployment layout, validated at the edge.

A workload is concurrent sequences, prompt tokens and output tokens; a layout
says how the model spreads over devices (:mod:`estimator.physics.parallel` has the
formulas). Impossible combinations are rejected here, with what would work.
"""

from __future__ import annotations

from typing import Annotated, Iterable, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from estimator.errors import ConfigurationError, describe_validation_error
from estimator.units import GiB
from estimator.physics.kv_tiers import TIERS
from estimator.physics.offload import DEFAULT_UBATCH_TOKENS, OFFLOAD_MODES
from estimator.serving.lengths import length_mix
from estimator.specs.model import ModelSpec

# The host CPU assumed for partial offload unless told otherwise: a current desktop CPU
# with dual-channel DDR5, the usual home of a consumer GPU.
DEFAULT_HOST_CPU = "AMD Ryzen 9 7950X"
# An HGX or OAM baseboard: eight devices on one NVLink / Infinity Fabric switch.
DEFAULT_DEVICES_PER_NODE = 8


class Layout(BaseModel):
    """How a deployment spreads over devices: tp × pp devices per replica, dp replicas, ep expert ranks."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tp: int = Field(default=1, ge=1, description="tensor-parallel ranks")
    pp: int = Field(default=1, ge=1, description="pipeline stages")
    ep: int = Field(default=1, ge=1, description="expert-parallel ranks (within the TP group)")
    dp: int = Field(default=1, ge=1, description="data-parallel replicas")
    attention_dp: bool = Field(
        default=False, description="attention data-parallel over the tp ranks: each runs attention on its own "
                                   "sequences with whole weights and cache entries, MLP and MoE layers keep the "
                                   "tp/ep split (SGLang --enable-dp-attention, TensorRT-LLM enable_attention_dp)")
    devices_per_node: int = Field(default=DEFAULT_DEVICES_PER_NODE, ge=1,
                                  description="devices sharing one scale-up link (NVLink domain)")
    network_gbps: float = Field(default=400.0, gt=0, description="scale-out network per device, Gbit/s one way")

    def columns(self) -> dict:
        """The values :func:`estimator.evaluation.compute.compute_results` reads for this layout."""
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep, "dp": self.dp, "node": self.devices_per_node,
                "network_bytes_per_s": self.network_gbps * 1e9 / 8, "attention_dp": float(self.attention_dp)}

    @property
    def devices(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def label(self) -> str:
        nodes = "" if self.tp * self.pp <= self.devices_per_node else \
            f" over {-(-self.tp * self.pp // self.devices_per_node)} nodes"
        return f"tp{self.tp} pp{self.pp} ep{self.ep} dp{self.dp}{' attention-dp' if self.attention_dp else ''}{nodes}"

    @classmethod
    def from_devices(cls, devices: int | None = None, tp: int | None = None, pp: int = 1, ep: int = 1,
                     model: ModelSpec | None = None, **system) -> "Layout":
        """Fill in what is not given; TP and PP alone use tp·pp devices.

        N devices alone: tensor parallelism over all of them within one scale-up domain
        (``devices_per_node``), data-parallel replicas across domains (the usual serving layout:
        TP traffic stays on NVLink). With ``model``, the TP degree is the largest that also splits
        its attention and KV heads (unless attention runs data-parallel); the rest become replicas.
        """
        for name, value in (("devices", devices), ("tp", tp), ("pp", pp), ("ep", ep)):
            if value is not None and (isinstance(value, bool) or not float(value).is_integer() or value < 1):
                raise ConfigurationError(f"{name} must be a whole number >= 1, got {value!r}")
        if tp is None:
            devices = devices or pp
            if devices % pp:
                raise ConfigurationError(f"{devices} devices cannot form {pp} pipeline stages; use a multiple of {pp}")
            # tensor parallelism stays on the scale-up link; beyond it, replicas (the usual serving layout)
            node = system.get("devices_per_node", cls.model_fields["devices_per_node"].default)
            tp = next(t for t in range(min(devices // pp, node), 0, -1)
                      if (devices // pp) % t == 0
                      and (model is None or system.get("attention_dp") or _splits_heads(model, t)))
        devices = devices or tp * pp
        if devices % (tp * pp):
            raise ConfigurationError(
                f"{devices} devices cannot hold replicas of tp={tp} x pp={pp} = {tp * pp} devices; "
                f"use a multiple of {tp * pp}, or change --tp/--pp")
        try:
            return cls(tp=tp, pp=pp, ep=ep, dp=devices // (tp * pp), **system)
        except ValidationError as exc:
            raise ConfigurationError(f"invalid layout: {describe_validation_error(exc)}") from None


def scale_up_domain(hardware) -> int:
    """Devices sharing one scale-up link: as the device's entry states (an NVL72 rack: 72), else an 8-device
    HGX/OAM board."""
    link = hardware.scale_up_link
    return link.domain_devices if link is not None and link.domain_devices else DEFAULT_DEVICES_PER_NODE


def as_layout(value: "int | Layout") -> Layout:
    """An int is a device count split by tensor parallelism."""
    return value if isinstance(value, Layout) else Layout.from_devices(devices=value)


def check_workload(batches: Iterable, prompts: Iterable, outputs: Iterable, mean_lengths: bool = False) -> None:
    """At least one sequence, one prompt token and one output token; whole numbers, except lengths that are
    the means of a benchmark dataset (``mean_lengths``)."""
    checks = (("batch", batches, True), ("prompt tokens", prompts, not mean_lengths),
              ("output tokens", outputs, not mean_lengths))
    for label, values, whole in checks:
        for v in values:
            if isinstance(v, bool) or not np.isfinite(v) or (whole and not float(v).is_integer()) or v < 1:
                kind = "a whole number" if whole else "a number"
                raise ConfigurationError(f"{label} must be {kind} >= 1, got {v!r}")


def _splits_heads(model: ModelSpec, tp: int) -> bool:
    """Whether ``tp`` ranks split the model's attention heads, and its KV heads (or replicate them evenly)."""
    sh = model.shape
    return sh.num_attention_heads % tp == 0 and (sh.num_kv_heads % tp == 0 or tp % sh.num_kv_heads == 0)


def tp_copies_kv(model: ModelSpec, tp: int) -> bool:
    """Whether tp tensor-parallel ranks hold copies of the KV cache: an MLA latent, or fewer KV heads than ranks."""
    return model.shape.mla is not None or model.shape.num_kv_heads < tp


def with_attention_dp(layout: Layout, model: ModelSpec) -> Layout:
    """The same devices with attention data-parallel over the tp ranks, routed experts over them by expert
    parallelism when they divide (the layout engines recommend for DeepSeek; docs/formulas.md §8)."""
    moe = model.shape.moe
    ep = layout.tp if moe is not None and moe.num_experts % layout.tp == 0 else layout.ep
    return layout.model_copy(update={"attention_dp": True, "ep": ep})


def check_layout(model: ModelSpec, layout: Layout) -> None:
    """Reject layouts the model cannot be split into, saying what would work."""
    sh = model.shape
    if not layout.attention_dp:   # under attention data parallelism no rank splits the heads
        if sh.num_attention_heads % layout.tp:
            raise ConfigurationError(
                f"{model.name} has {sh.num_attention_heads} attention heads, which tp={layout.tp} tensor-parallel "
                f"ranks cannot split evenly; use a tp that divides {sh.num_attention_heads}, or attention data "
                "parallelism")
        if sh.num_kv_heads % layout.tp and layout.tp % sh.num_kv_heads:
            raise ConfigurationError(
                f"{model.name} has {sh.num_kv_heads} KV heads: tp={layout.tp} must divide them or be a multiple "
                "of them")
    if layout.pp > sh.num_layers:
        raise ConfigurationError(f"pp={layout.pp} pipeline stages exceed {model.name}'s {sh.num_layers} layers")
    if layout.ep > 1:
        if sh.moe is None:
            raise ConfigurationError(f"ep={layout.ep}: {model.name} is dense; expert parallelism needs an MoE model")
        if sh.moe.num_experts % layout.ep or layout.tp % layout.ep:
            raise ConfigurationError(
                f"ep={layout.ep} must divide both {model.name}'s {sh.moe.num_experts} experts and tp={layout.tp} "
                "(experts are split within the tensor-parallel group)")


# Options that enter an evaluation only as numbers on its columns, never in its control flow (field: column): rows
# that differ in these alone are evaluated in one vectorized call, as predict groups a dataset's rows and a fit
# evaluates them hundreds of times.
PER_ROW_COLUMNS = {"prefix_tokens": "prefix_tokens", "attention": "fused_attention", "ubatch_tokens": "ubatch_tokens",
                   "draft_tokens": "spec_tokens", "acceptance": "acceptance", "draft_cost": "draft_cost"}


class ServingOptions(BaseModel):
    """How the engine manages the KV cache and attention (:mod:`estimator.physics.kvcache`)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kv_alloc: Literal["paged", "contiguous"] = Field(default="paged", description="KV-cache allocation")
    kv_block_tokens: int = Field(default=16, ge=1, description="tokens per KV block when paged (vLLM default 16)")
    prefix_tokens: int = Field(default=0, ge=0, description="prompt prefix shared by all requests, cached once")
    attention: Literal["fused", "unfused"] = Field(
        default="fused", description="FlashAttention-style fused kernels, or eager attention writing the scores")
    offload: Literal["none", "auto"] = Field(
        default="none", description="auto: weights that do not fit stay in host memory and stream over the host link")
    gpu_layers: int | None = Field(
        default=None, ge=0, description="llama.cpp-style partial offload: layers on the device, the rest on the host CPU")
    host_cpu: str = Field(default=DEFAULT_HOST_CPU, description="host CPU that runs offloaded layers or experts")
    cpu_moe: Annotated[int, Field(ge=0)] | Literal["all"] = Field(
        default=0, description="llama.cpp --n-cpu-moe N / --cpu-moe: the routed experts of the first N MoE layers "
                               "('all': every MoE layer) stay in host memory and run on the host CPU")
    ubatch_tokens: int = Field(default=DEFAULT_UBATCH_TOKENS, ge=1,
                               description="llama.cpp micro-batch (-ub, n_ubatch): a prompt runs in passes of this "
                                           "many tokens, so its workspace holds one pass, a MoE prompt touches its "
                                           "experts once a pass and host-resident experts cross the link once a pass")
    draft_model: str | None = Field(default=None, description="speculative decoding: draft model name")
    draft_tokens: int = Field(default=0, ge=0, le=64, description="speculative decoding: tokens drafted per step (γ)")
    acceptance: float = Field(default=0.7, ge=0, le=1, description="per-token acceptance rate of drafts (α)")
    draft_cost: float = Field(
        default=0.0, ge=0, le=1, description="without a draft model: draft cost per step as a fraction of a target "
                                             "step (n-gram lookup ~0, EAGLE/MTP heads ~0.05-0.1)")

    concurrency: int = Field(default=0, ge=0, description="closed-loop load: requests kept in flight (0: use batch)")
    rate: float = Field(default=0.0, ge=0, description="open-loop load: requests per second (0: use batch)")
    chunked_prefill: int = Field(default=0, ge=0, description="token budget per step for chunked prefill (0: off)")
    num_requests: int = Field(default=0, ge=0, description="with a rate: a finite benchmark of this many requests "
                                                           "(0: an endless steady state); with a concurrency C: "
                                                           "this many through C clients, the first C sent at once; "
                                                           "with no load: this many sent at once (an offline run, "
                                                           "vllm bench serve's default)")
    max_num_seqs: int | None = Field(
        default=None, ge=1, description="the scheduler's cap on sequences run at once (vLLM --max-num-seqs); "
                                        "None: the engine profile's default for the device")
    lengths: str | None = Field(
        default=None, max_length=4096, description="under load or in a run: request lengths from a preset (chat, "
                                                    "sharegpt, sharegpt-bench, rag, reasoning, random, random-r0.8), "
                                                    "one at other means (random@500/500) or a CSV of prompt,output "
                                                    "per request")
    kv_offload: Literal["none", "cpu", "disk"] = Field(
        default="none", description="a second KV tier for prefix caching (LMCache-style): host memory or a drive")
    kv_offload_gib: float = Field(default=0.0, ge=0, le=1e6, description="the tier's size per replica, GiB")
    expert_skew: float = Field(
        default=0.0, ge=0, le=10, description="MoE routing skew: the Zipf exponent s of expert popularity, "
                                              "p_i ∝ i^-s (0: uniform, the default)")
    prefix_hit_rate: float = Field(
        default=0.0, ge=0, le=1, description="share of prompt tokens (beyond a shared --prefix-tokens) found in "
                                             "the engine's prefix cache: they skip prefill")

    @property
    def under_load(self) -> bool:
        """A rate, or a concurrency with more requests to send than clients (a steady state forms)."""
        return bool(self.rate or (self.concurrency and not 0 < self.num_requests <= self.concurrency))

    @property
    def all_at_once(self) -> bool:
        """A finite run whose requests are all sent at once (no rate; no concurrency, or one of all of them)."""
        return bool(self.num_requests) and not self.under_load

    @property
    def single_client(self) -> bool:
        """One client in a closed loop: no request waits and no other prompt rides in its steps."""
        return self.concurrency == 1 and not self.rate

    @property
    def engine_sets_batch(self) -> bool:
        """The engine's scheduler picks the running batch (under a load, or all at once), so its cap applies."""
        return self.under_load or self.all_at_once

    @property
    def uses_host_cpu(self) -> bool:
        """Whether the host CPU computes part of the model (partial offload by layers, or experts on the host)."""
        return self.gpu_layers is not None or self.cpu_moe != 0

    def columns(self) -> dict:
        """The arrays :func:`estimator.evaluation.compute.compute_results` reads."""
        mode = OFFLOAD_MODES["layers"] if self.gpu_layers is not None else OFFLOAD_MODES[self.offload]
        cap = np.inf if self.max_num_seqs is None else float(self.max_num_seqs)
        return {"paged": self.kv_alloc == "paged", "block_tokens": float(self.kv_block_tokens),
                "prefix_tokens": float(self.prefix_tokens), "fused_attention": self.attention == "fused",
                "offload": mode, "gpu_layers": float(self.gpu_layers or 0),
                "cpu_moe": np.inf if self.cpu_moe == "all" else float(self.cpu_moe),
                "ubatch_tokens": float(self.ubatch_tokens), "spec_tokens": self.draft_tokens,
                "acceptance": self.acceptance, "draft_cost": self.draft_cost,
                # clients with no more requests to send than there are of them send them all at once
                "concurrency": 0.0 if self.all_at_once else float(self.concurrency), "rate": self.rate,
                "chunk_tokens": float(self.chunked_prefill),
                "max_num_seqs": cap, "profiled_sequences": cap,
                "num_requests": float(self.num_requests),
                "prefix_hit_rate": self.prefix_hit_rate,
                "length_mix": length_mix(self.lengths) if self.lengths else None, "expert_skew": self.expert_skew,
                "kv_tier": TIERS[self.kv_offload], "kv_tier_bytes": self.kv_offload_gib * GiB}

    def shared(self) -> "ServingOptions":
        """These options with the per-row ones (``PER_ROW_COLUMNS``) at their defaults: what rows evaluated in one
        call have in common."""
        return self.model_copy(update={name: type(self).model_fields[name].default for name in PER_ROW_COLUMNS})

    @staticmethod
    def labels(options: list["ServingOptions"]) -> list[str]:
        """What tells apart the options of one sweep's serving axis: the per-row fields (``PER_ROW_COLUMNS``)
        whose values differ among them, as ``name=value``."""
        varying = [name for name in PER_ROW_COLUMNS if len({getattr(o, name) for o in options}) > 1]
        return [", ".join(f"{name}={getattr(o, name)}" for name in varying) or "as given" for o in options]

    @staticmethod
    def stacked_columns(options: list["ServingOptions"]) -> dict:
        """The columns of rows whose options differ only in ``PER_ROW_COLUMNS``: those as one array, a value per
        row; the rest as any one row's."""
        by_row = [o.columns() for o in options]
        return {**by_row[0], **{key: np.array([c[key] for c in by_row]) for key in PER_ROW_COLUMNS.values()}}

    def check(self, prompts: Iterable[int], models: Iterable[ModelSpec] = (), layouts: Iterable[Layout] = ()) -> None:
        """Reject combinations that cannot run, saying what would."""
        if self.concurrency and self.rate:
            raise ConfigurationError("give the load as --concurrency C (requests in flight) or --rate R "
                                     "(requests per second), not both")
        if self.chunked_prefill and not self.under_load:
            raise ConfigurationError("--chunked-prefill shapes a steady state under load; add --concurrency or --rate")
        if (self.kv_offload == "none") != (self.kv_offload_gib == 0):
            raise ConfigurationError("a second KV tier needs both --kv-offload cpu|disk and --kv-offload-gib N > 0")
        if self.kv_offload != "none" and not self.prefix_hit_rate:
            raise ConfigurationError("--kv-offload holds prefix-cache hits; add --prefix-hit-rate H")
        if self.expert_skew:
            dense = [m.name for m in models if m.shape.moe is None]
            if dense:
                raise ConfigurationError(f"--expert-skew shapes MoE routing, but {dense} are dense models")
            if self.cpu_moe != 0:
                raise ConfigurationError("--expert-skew with experts on the host CPU (--cpu-moe / --n-cpu-moe) is not "
                                         "modelled: give one of them")
        if self.lengths is not None:
            if not self.engine_sets_batch:
                raise ConfigurationError("--lengths gives the request mix of a load or a run; add --concurrency, "
                                         "--rate or --num-requests")
            mix = length_mix(self.lengths)   # a bad file or preset name is refused here, naming it
            if mix.prompt_tokens.min() <= self.prefix_tokens:
                raise ConfigurationError(f"--lengths {self.lengths} has prompts of {mix.prompt_tokens.min():.0f} "
                                         f"tokens, not longer than the cached prefix ({self.prefix_tokens})")
        if self.max_num_seqs is not None and not self.engine_sets_batch:
            raise ConfigurationError("--max-num-seqs caps the running batch of a steady state under load or of a "
                                     "run of --num-requests sent at once; add --concurrency, --rate or "
                                     "--num-requests (at a fixed --batch, the batch is what runs)")
        if (self.draft_model or self.draft_cost) and not self.draft_tokens:
            raise ConfigurationError("speculative decoding needs --draft-tokens G (tokens drafted per step), e.g. 4")
        if self.draft_model and self.draft_cost:
            raise ConfigurationError("--draft-cost prices draft heads without a draft model; with --draft-model the "
                                     "draft is timed from its own size: give one of them")
        if self.gpu_layers is not None:
            if self.offload != "none":
                raise ConfigurationError("choose one kind of offload: --offload auto (stream weights over the host "
                                         "link) or --gpu-layers N (run the other layers on the host CPU)")
            if any(x.tp * x.pp > 1 for x in layouts):
                raise ConfigurationError("--gpu-layers splits one device's model with the host CPU; use --gpus 1")
            too_many = [m.name for m in models if self.gpu_layers > m.shape.num_layers]
            if too_many:
                raise ConfigurationError(f"--gpu-layers {self.gpu_layers} exceeds the layer count of {too_many}")
        if self.cpu_moe != 0:
            self._check_cpu_moe(list(models), list(layouts))
        if self.prefix_tokens and self.kv_alloc != "paged":
            raise ConfigurationError("prefix caching shares paged KV blocks; use --kv-alloc paged with --prefix-tokens")
        short = [p for p in prompts if p <= self.prefix_tokens]
        if short:
            raise ConfigurationError(
                f"the cached prefix ({self.prefix_tokens} tokens) must be shorter than the prompt; got prompts {short}")

    def _check_cpu_moe(self, models: list[ModelSpec], layouts: list[Layout]) -> None:
        """Experts on the host CPU: one device, an MoE model, and no other kind of offload."""
        if self.gpu_layers is not None or self.offload != "none":
            raise ConfigurationError("--cpu-moe / --n-cpu-moe keep every layer on the GPU but the experts; combining "
                                     "them with --gpu-layers or --offload auto is not modelled: give one of them")
        if any(x.tp * x.pp > 1 for x in layouts):
            raise ConfigurationError("--cpu-moe / --n-cpu-moe split one device's model with the host CPU; use --gpus 1")
        dense = [m.name for m in models if m.shape.moe is None]
        if dense:
            raise ConfigurationError(f"--cpu-moe / --n-cpu-moe keep MoE experts on the host, but {dense} are dense "
                                     "models; use --gpu-layers N to run layers on the host CPU")
        if self.cpu_moe != "all":
            too_many = [f"{m.name} ({m.shape.num_layers - m.shape.moe.num_dense_layers})" for m in models
                        if self.cpu_moe > m.shape.num_layers - m.shape.moe.num_dense_layers]
            if too_many:
                raise ConfigurationError(f"--n-cpu-moe {self.cpu_moe} exceeds the MoE layers of {', '.join(too_many)}; "
                                         "use --cpu-moe for all of them")
