"""Fit engine parameters to published measurements, within physical bounds.

For each engine, sixteen parameters are fitted by bounded least squares on the log error,
log(predicted / measured), over all of that engine's rows, across every device and model (never one
parameter per data point). Each is the **product** the estimate uses, as a fraction of the datasheet,
on the group's typical device (its default device efficiency times the engine's):

    θ = (bandwidth fraction of 16/8-bit weight streaming on datacenter, desktop and unified devices,
         the same for dequantizing kernels (weight-only int4/int8, GGUF, FP4), dense-compute fraction on
         the three groups, per-step, per-layer and per-sequence-per-step overheads, the share of
         the tokens' worth of FLOPs each MoE expert a pass touches costs beyond its own tokens, the
         bandwidth fraction at which the attention kernels read the KV cache, on the datacenter device,
         the FP4 GEMMs' share, the FP32 fraction a vector decode-attention kernel reaches, and the most
         bytes a second one SM streams through 16-bit weight kernels, these two fitted only for an engine
         that has such kernels)

so the physical bounds are plain boxes: weights and the KV cache stream at no more than 0.95 of
datasheet bandwidth, compute reaches no more
than the dense peak (an engine that accumulates in FP16 on a GeForce card reaches twice the listed
FP32-accumulate peak: ``compute_ceiling``), and the overheads stay within launch and synchronisation
costs (docs/formulas.md §9). A parameter that ends on a bound is reported: it means a mechanism is
missing, not a better efficiency.

A weak prior pulls each parameter towards the documented default (:mod:`estimator.efficiency.defaults`),
so a parameter the data cannot identify (an engine with only decode rows has no say on compute) stays
where the priors put it, and a pull between the device groups keeps one engine's kernels from being three
unrelated efficiencies where one group has few rows. A backend variant (``llama.cpp@rocm``) keeps its
engine's KV-cache product instead of fitting its own. The error quoted is leave-one-source-out
(:mod:`estimator.validation.cross_validation`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property

import numpy as np

from estimator.efficiency.defaults import (
    DEVICE_GROUPS,
    GDDR,
    GENERIC_ENGINE,
    GROUP_OF_CLASS,
    HBM,
    UNIFIED,
    EngineDefaults,
    bandwidth_group,
    matmul_ceilings,
)
from estimator.efficiency.engine_profiles import engine, split_engine_name
from estimator.evaluation.intervals import measurement_regime
from estimator.specs.database import Database, load_database
from estimator.validation.dataset import Dataset
from estimator.validation.jacobian import column_groups, forward_steps, grouped_jacobian
from estimator.validation.predict import resolve_rows
from estimator.validation.resolved import Resolved, predict_resolved, predicted_array, predicted_values
from estimator.validation.workers import map_in_workers

GROUPS = tuple(DEVICE_GROUPS)
PARAMETER_NAMES = (*(f"bandwidth_{g}" for g in GROUPS), *(f"dequant_bandwidth_{g}" for g in GROUPS),
                   *(f"compute_{g}" for g in GROUPS), "per_step_s", "per_layer_s", "per_sequence_s",
                   "expert_tile_tokens", "kv_bandwidth_datacenter", "fp4_compute_scale", "vector_attention",
                   "native_bytes_per_s_per_sm")
# The default device efficiencies of each group's typical device (HBM or GDDR cards, unified-memory SoCs):
# a fitted product divided by them is the engine's own factor.
TYPICAL_DEVICE = {"datacenter": HBM, "desktop": GDDR, "unified": UNIFIED}
# A few microseconds of host work per sequence and step: the order of a Python scheduler's bookkeeping.
PRIOR_PER_SEQUENCE_S = 5e-6
# A grouped GEMM pads each expert's rows to its tile: on average half a 16-row tile (the smallest MMA tile).
PRIOR_EXPERT_TILE_TOKENS = 8.0
# A kernel bounded per SM: by Little's law, one 4-byte load in flight for each of an SM's 2,048 threads (8 KiB)
# over a loaded memory latency of the order of 0.8 us is 10 GB/s an SM; llama.cpp's 16-bit mat-vecs read 8-10 GB/s
# an SM on a V100, an A100 and an H100 PCIe (docs/formulas.md §9).
PRIOR_BYTES_PER_S_PER_SM = 1e10
PRIOR = np.array([*(GENERIC_ENGINE.bandwidth_eff["native"] * TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS),
                  *(GENERIC_ENGINE.bandwidth_eff["gguf"] * TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS),
                  *(GENERIC_ENGINE.compute_eff * TYPICAL_DEVICE[g].compute_eff for g in GROUPS),
                  GENERIC_ENGINE.per_step_s, GENERIC_ENGINE.per_layer_s, PRIOR_PER_SEQUENCE_S,
                  PRIOR_EXPERT_TILE_TOKENS, GENERIC_ENGINE.kv_bandwidth_eff * HBM.bandwidth_eff,
                  GENERIC_ENGINE.fp4_compute_scale, GENERIC_ENGINE.vector_attention_eff, PRIOR_BYTES_PER_S_PER_SM])
# Physical bounds. Bandwidth: 0.95 of datasheet (the best kernels measure 0.8-0.9, docs/formulas.md §9).
# Compute: the dense peak. Per step: 10 ms (a scheduler and sampler step of a serving engine under load
# is 1-5 ms); per layer: 100 us (about 20 eager kernel launches of 5 us; 1.3 us each under CUDA graphs);
# per sequence and step: 100 us of host work (Python scheduling, sampling, detokenizing one sequence).
# A datacenter device whose measured best GEMM beats the typical device's default (the A100's 0.869 vs
# 0.85) would lift the product above the typical one: the bound keeps that device at the dense peak.
DATACENTER_COMPUTE_UPPER = min(1.0, HBM.compute_eff / max(matmul_ceilings().values()))
# MoE expert GEMMs: each touched expert costs the FLOPs of 0.01 to 1,024 more tokens (a 128-row tile is
# the largest common GEMM tile; eight of them is far beyond any padding or routing cost). FP4 GEMMs reach
# 0.1 to 1 times the share of their peak the engine's other GEMMs reach of theirs: never more, since each
# also quantizes its activations and handles block scales; the product stays under the dense FP4 peak. A vector
# decode-attention kernel reaches 0.01 to 1 of the FP32 peak: its lanes never issue more than one FMA a cycle.
LOWER = np.array([*[0.05] * 6, *[0.01] * 3, 1e-6, 1e-7, 1e-8, 0.01, 0.05, 0.1, 0.01, 1e9])
UPPER = np.array([*[0.95] * 6, DATACENTER_COMPUTE_UPPER, 1.00, 1.00, 1e-2, 1e-4, 1e-4, 1024.0, 0.95, 1.0, 1.0, 1e11])
# An engine that issues its ops one at a time from Python (eager PyTorch) pays the host's time per op on
# every layer: about 35 ops (norms, projections, attention, the KV-cache writes and GQA expansion, MLP) at
# the 10-25 us a launched op costs from Python (two H200 profiles, in two VMs, measured 9.3 and 6.2 us for a
# bare launch and 23.4 and 18.6 us per op of a small-op chain; docs/formulas.md §13). Its prior is 0.5 ms per
# layer and its bound 2 ms, not the 100 us of an engine that launches whole graphs.
EAGER_PRIOR_PER_LAYER_S = 5e-4
EAGER_MAX_PER_LAYER_S = 2e-3
# Metal has no graph replay: each dependent dispatch costs the Apple GPU about 5 us of its own time (5.16 us
# measured per barrier-separated dispatch on an M2 Pro, docs/formulas.md §9), and a transformer layer is
# 20-30 dispatches, so its prior is 25 of them and its bound 50, not CUDA's 100 us.
METAL_DISPATCH_S = 5.16e-6
METAL_PRIOR_PER_LAYER_S = 25 * METAL_DISPATCH_S
METAL_MAX_PER_LAYER_S = 50 * METAL_DISPATCH_S
PER_LAYER = PARAMETER_NAMES.index("per_layer_s")
PER_SEQUENCE, EXPERT_TILE = PARAMETER_NAMES.index("per_sequence_s"), PARAMETER_NAMES.index("expert_tile_tokens")
KV_BANDWIDTH = PARAMETER_NAMES.index("kv_bandwidth_datacenter")
VECTOR_ATTENTION = PARAMETER_NAMES.index("vector_attention")
PER_SM = PARAMETER_NAMES.index("native_bytes_per_s_per_sm")
# Weight of the prior, per parameter, in units of log error: a factor e away from the default
# costs as much as one row predicted e times off.
PRIOR_WEIGHT = 0.3
# Weight of the pull between device groups, in the same units: an engine runs the same kernels on every
# group, so its own factor (a product divided by the group's typical device efficiency) should differ
# little between groups. Each group's log factor is pulled towards the engine's mean over the three, so a
# group with few rows borrows from the others instead of being set by a handful of them (hierarchical
# pooling, docs/formulas.md §13). 2 was chosen among 0.5, 1, 2 and 4 on the leave-one-source-out figures.
GROUP_POOL_WEIGHT = 2.0
# The bandwidth factors of unified-memory SoCs are pulled towards the GDDR cards' instead: LPDDR, like GDDR, gives
# each compute unit few bytes a second (GB10 5.7 GB/s per SM, an RTX 4090 7.9; an A100 18, an H200 36), so a
# kernel whose requests in flight per SM are bounded reaches a like share of it, and HBM parts are another
# population (docs/formulas.md §9, "Bandwidth groups by memory"). Compute keeps the mean of the three.
BANDWIDTH_POOL_PARENT = {"unified": "desktop"}
TYPICAL_LOG_EFF = np.log([*[TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS] * 2,
                          *[TYPICAL_DEVICE[g].compute_eff for g in GROUPS]])


# What an engine's kernels and host loop are (FP16 accumulation, PyTorch's own GEMMs, eager launches and their
# cost per routed expert, prompts run in micro-batches, experts run as mat-vecs): carried from its profile into a
# fit, never fitted.
KERNEL_PROPERTIES = ("fp16_accumulate", "attention_fp16_accumulate_share", "torch_kernels", "eager_host",
                     "vector_decode_attention", "bounded_per_sm",
                     "per_expert_s", "prefill_in_ubatches", "expert_matvec_tokens", "expert_tile_max_tokens",
                     "expert_pair_reads_tokens", "expands_grouped_kv",
                     "broadcasts_grouped_kv", "caps_scores_in_fused_attention", "score_bits", "dequantizes_kv_cache",
                     "nonflash_scores_on_chip", "unfused_elementwise", "reference_decoder")
# How the engine budgets memory and schedules its steps: its own defaults whatever the backend, so a variant
# takes its engine's.
MEMORY_PROPERTIES = ("memory_utilization", "kv_free_fraction", "prefill_chunk_tokens", "prefill_runs_alone",
                     "embedding_on_host", "graphed_prefill_tokens", "eager_prefill_layer_s",
                     "blocking_output_per_sequence_s", "sampler_warmup_bytes_per_logit", "allocates_kv_on_demand")


def parameters_from(theta, **properties) -> EngineDefaults:
    """Engine factors from fitted products: each product divided by its group's typical device efficiency;
    ``properties`` are any of KERNEL_PROPERTIES and MEMORY_PROPERTIES (the generic engine's where not given)."""
    values = dict(zip(PARAMETER_NAMES, (float(x) for x in theta)))
    bandwidth = {g: values[f"bandwidth_{g}"] / TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS}
    dequantizing = {g: values[f"dequant_bandwidth_{g}"] / TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS}
    native, dequant = bandwidth["datacenter"], dequantizing["datacenter"]
    compute = {g: values[f"compute_{g}"] / TYPICAL_DEVICE[g].compute_eff for g in GROUPS}
    return EngineDefaults(
        bandwidth_eff={"native": native, "weight_only": dequant, "gguf": dequant, "fp4": dequant},
        bandwidth_scale_by_group={g: bandwidth[g] / native for g in GROUPS if g != "datacenter"},
        dequant_scale_by_group={g: dequantizing[g] / dequant for g in GROUPS if g != "datacenter"},
        kv_bandwidth_eff=values["kv_bandwidth_datacenter"] / TYPICAL_DEVICE["datacenter"].bandwidth_eff,
        compute_eff=compute["datacenter"],
        compute_eff_by_group=compute, per_step_s=values["per_step_s"], per_layer_s=values["per_layer_s"],
        per_sequence_s=values["per_sequence_s"], expert_tile_tokens=values["expert_tile_tokens"],
        fp4_compute_scale=values["fp4_compute_scale"], vector_attention_eff=values["vector_attention"],
        native_bytes_per_s_per_sm=values["native_bytes_per_s_per_sm"] if properties.get("bounded_per_sm") else None,
        allreduce_latency_s=GENERIC_ENGINE.allreduce_latency_s, **properties,
        basis="fitted: estimator/validation/fitting.py on measurements_db (see the profile's fit record)")


def theta_of(p: EngineDefaults) -> np.ndarray:
    native, dequant = p.bandwidth_eff["native"], p.bandwidth_eff["gguf"]
    bandwidth = [native * p.bandwidth_scale_by_group.get(g, 1.0) * TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS]
    dequantizing = [dequant * p.dequant_scale_by_group.get(g, p.bandwidth_scale_by_group.get(g, 1.0))
                    * TYPICAL_DEVICE[g].bandwidth_eff for g in GROUPS]
    compute = [p.compute_eff_by_group.get(g, p.compute_eff) * TYPICAL_DEVICE[g].compute_eff for g in GROUPS]
    return np.array([*bandwidth, *dequantizing, *compute, p.per_step_s, p.per_layer_s,
                     max(p.per_sequence_s, LOWER[PER_SEQUENCE]), max(p.expert_tile_tokens, LOWER[EXPERT_TILE]),
                     p.kv_bandwidth_eff * TYPICAL_DEVICE["datacenter"].bandwidth_eff, p.fp4_compute_scale,
                     p.vector_attention_eff, p.native_bytes_per_s_per_sm or PRIOR_BYTES_PER_S_PER_SM])


def synthetic_routing(row: dict, config, engine_name: str) -> bool:
    """A MoE batch fed synthetic token ids (the ``token_ids`` column) whose kernel reads each touched expert once
    (more tokens than the engine's ``expert_pair_reads_tokens``): its bytes follow how those ids route (token 0
    everywhere: all to one token's experts; random ids: to fewer distinct experts than uniform routing,
    docs/formulas.md §9), not how text does, so the row is judged but not fitted on."""
    return (bool(row.get("token_ids")) and config.model.shape.moe is not None
            and config.batch > engine(engine_name).parameters.expert_pair_reads_tokens)


@dataclass
class Problem:
    """The resolved rows of a dataset, with their measured values, engines and sources.

    ``fits`` says whether the estimator thinks each configuration fits in memory: every row here ran,
    so a False is a memory-model failure, counted (predicted as if it fitted), never dropped.
    ``limit`` is each row's prediction at the physical limit (100% of datasheet, no overheads).
    """

    resolved: Resolved
    measured: np.ndarray
    sources: np.ndarray
    engines: np.ndarray
    rows: list[dict]
    fits: np.ndarray
    limit: np.ndarray
    # engine fits on exactly these rows, by name: a backend variant's fit reuses its engine's (never copied by
    # dataclasses.replace, so a problem with other measurements fits afresh)
    fitted: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @cached_property
    def judged_only(self) -> np.ndarray:
        """Rows judged but not fitted on: serving rows (a client concurrency or request rate, or a latency of
        an offline run that sent every request at once), whose latencies rest on the queueing model as much
        as on the engine's efficiencies; any row of a finite run of ``num_requests`` sent at once to a
        server, whose throughput is also set by its queue and by the drain of its longest requests
        (docs/formulas.md §13), not by the engine's kernels alone; and MoE batches of synthetic token ids
        (:func:`synthetic_routing`). Computed once per problem: every engine's fit in a fold asks for it."""
        r = self.resolved
        return np.array([measurement_regime(m, c.batch, sat, s.under_load) == "serving" or (sat and at_once > 0)
                         or synthetic_routing(row, c, name)
                         for m, c, sat, s, at_once, row, name in zip(r.metrics, r.configs, r.saturate, r.serving,
                                                                     r.requests_at_once, self.rows, r.engines)],
                        dtype=bool)

    def subset(self, rows: np.ndarray) -> "Problem":
        """The rows a boolean mask selects, or those an index array names (an index given twice takes its row
        twice, as a bootstrap over sources draws a source twice: benchmarks/source_bootstrap.py)."""
        rows = np.asarray(rows)
        idx = np.flatnonzero(rows) if rows.dtype == bool else rows
        r = self.resolved
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return Problem(Resolved(**{f.name: pick(getattr(r, f.name)) for f in fields(Resolved) if f.name != "cache"}),
                       self.measured[idx], self.sources[idx], self.engines[idx], pick(self.rows), self.fits[idx],
                       self.limit[idx])


def build_problem(dataset: Dataset, db: Database, jobs: int | None = None) -> Problem:
    """Resolve the usable rows once; rows whose names or settings do not resolve are reported, not fitted.
    Each row's memory fit (with the shipped profiles) and its physical limit are predicted in ``jobs`` worker
    processes (:mod:`.workers`)."""
    rows = dataset.usable()
    resolved, _ = resolve_rows(rows, db)
    as_shipped, at_limit = map_in_workers(_predicted_rows, resolved, [False, True], jobs)
    fits = np.array([bool(r["fits"]) for r in as_shipped], dtype=bool)
    limit = predicted_values(resolved, at_limit)
    return Problem(resolved, np.array([float(rows[i]["value"]) for i in resolved.positions]),
                   np.array([rows[i]["source"] for i in resolved.positions]), np.array(resolved.engines),
                   [rows[i] for i in resolved.positions], fits, limit)


def _predicted_rows(resolved: Resolved, physical_limit: bool) -> list[dict]:
    return predict_resolved(resolved, physical_limit=physical_limit)


def _log_errors(problem: Problem, params: dict[str, EngineDefaults]) -> np.ndarray:
    return np.log(predicted_array(problem.resolved, params) / problem.measured)


GENERIC = "generic"   # the unnamed engine keeps the documented priors: nothing is fitted to it


def _group_pull(log_theta: np.ndarray) -> np.ndarray:
    """Each group's log engine factor minus the engine's mean over the groups, for bandwidth, dequantizing
    bandwidth and compute (the first nine parameters, three groups each), weighted; a group with a parent in
    BANDWIDTH_POOL_PARENT is pulled towards that group's bandwidth factors instead."""
    own = (log_theta[:len(TYPICAL_LOG_EFF)] - TYPICAL_LOG_EFF).reshape(3, len(GROUPS))   # bandwidth, dequant, compute
    pull = own - own.mean(axis=1, keepdims=True)
    for group, parent in BANDWIDTH_POOL_PARENT.items():
        g, p = GROUPS.index(group), GROUPS.index(parent)
        pull[:2, g] = own[:2, g] - own[:2, p]   # the two bandwidth rows
    return GROUP_POOL_WEIGHT * pull.ravel()


def kernel_properties(name: str) -> dict:
    """The properties a fit carries: the kernels' from the profile (or backend variant) itself, the memory
    budget from the engine."""
    return {**engine(name).parameters.model_dump(include=set(KERNEL_PROPERTIES)),
            **engine(split_engine_name(name)[0]).parameters.model_dump(include=set(MEMORY_PROPERTIES))}


def prior_and_bounds(name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The prior and the physical box of an engine's parameters: an eager engine's per-layer host time has its
    own (EAGER_PRIOR_PER_LAYER_S, EAGER_MAX_PER_LAYER_S), and so has an engine on Metal, whose dispatches cost
    more than CUDA's launches (METAL_PRIOR_PER_LAYER_S, METAL_MAX_PER_LAYER_S)."""
    prior, upper = PRIOR.copy(), UPPER.copy()
    if engine(name).parameters.eager_host:
        prior[PER_LAYER], upper[PER_LAYER] = EAGER_PRIOR_PER_LAYER_S, EAGER_MAX_PER_LAYER_S
    elif split_engine_name(name)[1] == "metal":
        prior[PER_LAYER], upper[PER_LAYER] = METAL_PRIOR_PER_LAYER_S, METAL_MAX_PER_LAYER_S
    return prior, LOWER, upper


def require_fit_extra() -> None:
    """Import what a fit needs beyond the core (the fit extra: scipy, threadpoolctl); an ImportError names the
    missing one."""
    import scipy.optimize  # noqa: F401
    import threadpoolctl  # noqa: F401


def _least_squares(rows: Problem, name: str, inherited: dict[int, float] | None = None):
    """Bounded least squares in log θ; ``inherited`` parameters (index: value) are held, not fitted."""
    # the fit needs scipy and threadpoolctl (the fit extra); predictions do not
    from scipy.optimize import least_squares
    from threadpoolctl import threadpool_limits

    kernels = kernel_properties(name)
    prior, lower, upper = prior_and_bounds(name)
    free = applicable(kernels)
    held = np.log(prior)
    for i, value in (inherited or {}).items():
        free[i], held[i] = False, np.log(value)

    def full(log_free):
        log_theta = held.copy()
        log_theta[free] = log_free
        return log_theta

    def data(log_free):
        return _log_errors(rows, {name: parameters_from(np.exp(full(log_free)), **kernels)})

    def regularizer(log_free):
        return np.concatenate([PRIOR_WEIGHT * (log_free - np.log(prior[free])), _group_pull(full(log_free))])

    last = {}   # the data residuals at the last point evaluated: scipy asks for the Jacobian where it just was

    def residuals(log_free):
        last.update(x=log_free.copy(), data=data(log_free))
        return np.concatenate([last["data"], regularizer(log_free)])

    log_lower, log_upper = np.log(lower[free]), np.log(upper[free])
    depends = _dependence(rows)[:, free]
    groups = column_groups(depends)

    def jacobian(log_free):
        f0 = last["data"] if np.array_equal(last.get("x"), log_free) else data(log_free)
        steps = forward_steps(log_free, log_lower, log_upper, DIFF_STEP)
        r0 = regularizer(log_free)
        # the regularizer costs nothing to evaluate: one parameter at a time
        moved = [regularizer(log_free + step) - r0 for step in np.diag(steps)]
        return np.vstack([grouped_jacobian(data, log_free, f0, steps, depends, groups),
                          np.array(moved).T / steps])

    start = np.clip(prior, lower * 1.001, upper * 0.999)[free]   # strictly inside the box
    # One BLAS thread: the fit's matrices (rows x 17) gain nothing from more, and where folds run in worker processes
    # side by side, each worker's idle BLAS threads spin on the cores the others compute on (on 2 cores the published
    # validation's folds took 109 s with two threads a worker, 76 s with one).
    with threadpool_limits(1):
        result = least_squares(residuals, np.log(start), jac=jacobian, bounds=(log_lower, log_upper), x_scale=1.0,
                               max_nfev=200)
    return Solution(result, full(result.x), free, len(rows.measured))


# Relative forward-difference step in log θ (scipy's diff_step): 0.1%, well above the estimate's rounding.
DIFF_STEP = 1e-3


def _dependence(rows: Problem) -> np.ndarray:
    """Whether each row's prediction may depend on each parameter at all (rows x parameters). Its weights stream
    at the bandwidth factor of its memory's group (:func:`bandwidth_group`), the dequantizing one where its format
    dequantizes and the other where not, and its GEMMs run at the compute factor of its market's group; a row whose
    MoE experts run on the host CPU (``cpu_moe``) reads the CPU's factors as well. Any row may depend on the
    other parameters."""
    depends = np.ones((len(rows.measured), len(PARAMETER_NAMES)), dtype=bool)
    columns = {kind: [PARAMETER_NAMES.index(f"{kind}_{g}") for g in GROUPS]
               for kind in ("bandwidth", "dequant_bandwidth", "compute")}
    hardware = load_database().hardware
    for i, (config, serving) in enumerate(zip(rows.resolved.configs, rows.resolved.serving)):
        devices = [config.hardware] + ([hardware.get(serving.host_cpu)] if serving.cpu_moe != 0 else [])
        stream = "dequant_bandwidth" if config.weight_format.dequant != "native" else "bandwidth"
        reads = {stream: {bandwidth_group(d) for d in devices},
                 "compute": {GROUP_OF_CLASS[d.device_class.value] for d in devices}}
        for kind, indices in columns.items():
            depends[i, indices] = [g in reads.get(kind, ()) for g in GROUPS]
    return depends


@dataclass
class Solution:
    """One least-squares fit: scipy's result (over the free parameters), the full log θ, which were free, rows."""

    result: object
    log_theta: np.ndarray
    free: np.ndarray
    rows: int


def applicable(kernels: dict) -> np.ndarray:
    """Which parameters mean anything for an engine with these kernel properties: the vector decode-attention
    kernel's share only where the engine has that kernel; the others stay at their priors, unfitted and unrecorded."""
    applies = np.ones(len(PARAMETER_NAMES), dtype=bool)
    applies[VECTOR_ATTENTION] = kernels["vector_decode_attention"]
    applies[PER_SM] = kernels["bounded_per_sm"]
    return applies


def _inherited(problem: Problem, name: str) -> dict[int, float]:
    """A backend variant (llama.cpp@rocm) keeps its engine's KV-cache read product, fitted on the same rows: its
    few rows, most of them short, cannot tell the attention kernels' reads from its compute (docs/formulas.md §9)."""
    base, backend = split_engine_name(name)
    if not backend:
        return {}
    return {KV_BANDWIDTH: float(theta_of(fit_engine(problem, base))[KV_BANDWIDTH])}


def fit_engine(problem: Problem, name: str) -> EngineDefaults:
    """Bounded least squares of one engine's parameters on its rows; the priors when it has none.

    Without rows the answer is the prior, never the engine's shipped (fitted) parameters, so a
    cross-validation fold cannot see the source it holds out.
    """
    return _fit(problem, name)[0]


def solution_of(problem: Problem, name: str) -> Solution | None:
    """The least-squares solution of an engine's fit on these rows (None without rows: its prior)."""
    return _fit(problem, name)[1]


def _fit(problem: Problem, name: str) -> tuple[EngineDefaults, Solution | None]:
    """The engine's parameters and its least-squares solution (None without rows), once per problem."""
    if name not in problem.fitted:
        rows = problem.subset((problem.engines == name) & ~problem.judged_only)
        kernels = kernel_properties(name)
        if not len(rows.measured) or name == GENERIC:
            problem.fitted[name] = parameters_from(prior_and_bounds(name)[0], **kernels), None
        else:
            solution = _least_squares(rows, name, _inherited(problem, name))
            problem.fitted[name] = parameters_from(np.exp(solution.log_theta), **kernels), solution
    return problem.fitted[name]


def fit_all(problem: Problem, jobs: int | None = None) -> dict[str, EngineDefaults]:
    """Every engine with rows fitted on all of them, in ``jobs`` worker processes (:mod:`.workers`)."""
    names = sorted(set(problem.engines[~problem.judged_only]))
    missing = [name for name in names if name not in problem.fitted]
    problem.fitted.update(zip(missing, map_in_workers(_fit, problem, missing, jobs)))
    return {name: fit_engine(problem, name) for name in names}
