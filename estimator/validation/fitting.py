"""Fit engine parameters to published measurements, and measure the error honestly.

For each engine, five parameters are fitted by bounded least squares on the log
error, log(predicted / measured), over all of that engine's rows, across every
device and model (never one parameter per data point):

    θ = (bandwidth efficiency of 16/8-bit kernels, of dequantizing kernels,
         prefill compute efficiency, per-step overhead, per-layer overhead)

A weak prior pulls each parameter towards the documented default
(:mod:`estimator.efficiency.defaults`), so a parameter the data cannot identify (an
engine with only decode rows has no say on compute) stays where the priors
put it. The error quoted is **leave-one-source-out**: for each source, every
engine is refitted without it and its rows are predicted — the figure a new,
unseen benchmark should expect. Prediction intervals are quantiles of those
held-out ratios measured / predicted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from estimator.efficiency.defaults import DEVICE_GROUPS, GENERIC_ENGINE, EngineDefaults
from estimator.specs.database import Database
from estimator.validation.dataset import Dataset
from estimator.validation.predict import Resolved, predict_resolved, predicted_values, resolve_rows

SCALED_GROUPS = ("desktop", "unified")    # bandwidth relative to the datacenter group
PARAMETER_NAMES = ("bandwidth_native", "bandwidth_dequant", *(f"bandwidth_scale_{g}" for g in SCALED_GROUPS),
                   *(f"compute_{g}" for g in DEVICE_GROUPS), "per_step_s", "per_layer_s")
PRIOR = np.array([GENERIC_ENGINE.bandwidth_eff["native"], GENERIC_ENGINE.bandwidth_eff["gguf"], 1.0, 1.0,
                  *[GENERIC_ENGINE.compute_eff] * len(DEVICE_GROUPS), GENERIC_ENGINE.per_step_s,
                  GENERIC_ENGINE.per_layer_s])
# compute may exceed the listed peak on desktop cards (FP16 accumulation, see EngineDefaults)
LOWER = np.array([0.10, 0.05, 0.5, 0.5, 0.03, 0.03, 0.03, 1e-6, 1e-7])
UPPER = np.array([1.00, 1.00, 1.25, 1.25, 1.00, 2.00, 1.00, 0.05, 2e-3])
# Weight of the prior, per parameter, in units of log error: a factor e away from the default
# costs as much as one row predicted e times off.
PRIOR_WEIGHT = 0.3
KV_TO_WEIGHT_BANDWIDTH = GENERIC_ENGINE.kv_bandwidth_eff / GENERIC_ENGINE.bandwidth_eff["native"]
DECODE_METRICS = ("decode_tps_per_seq", "decode_tps_total", "itl_ms", "throughput_out_tps",
                  "throughput_out_tps_per_gpu", "e2e_latency_s")
PREFILL_METRICS = ("prefill_tps", "ttft_ms")


def parameters_from(theta) -> EngineDefaults:
    native, dequant, *rest, per_step, per_layer = (float(x) for x in theta)
    scales, compute = rest[:len(SCALED_GROUPS)], rest[len(SCALED_GROUPS):]
    return EngineDefaults(
        bandwidth_eff={"native": native, "weight_only": dequant, "gguf": dequant, "fp4": dequant},
        kv_bandwidth_eff=min(1.0, native * KV_TO_WEIGHT_BANDWIDTH), compute_eff=compute[0],
        compute_eff_by_group=dict(zip(DEVICE_GROUPS, compute)), per_step_s=per_step,
        bandwidth_scale_by_group=dict(zip(SCALED_GROUPS, scales)),
        per_layer_s=per_layer, allreduce_latency_s=GENERIC_ENGINE.allreduce_latency_s,
        basis="fitted: estimator/validation/fitting.py on measurements_db (see the profile's fit record)")


def theta_of(p: EngineDefaults) -> np.ndarray:
    compute = [p.compute_eff_by_group.get(g, p.compute_eff) for g in DEVICE_GROUPS]
    scales = [p.bandwidth_scale_by_group.get(g, 1.0) for g in SCALED_GROUPS]
    return np.array([p.bandwidth_eff["native"], p.bandwidth_eff["gguf"], *scales, *compute, p.per_step_s,
                     p.per_layer_s])


@dataclass
class Problem:
    """The resolved rows of a dataset, with their measured values, engines and sources."""

    resolved: Resolved
    measured: np.ndarray
    sources: np.ndarray
    engines: np.ndarray
    rows: list[dict]

    def subset(self, mask: np.ndarray) -> "Problem":
        idx = np.flatnonzero(mask)
        r = self.resolved
        pick = lambda xs: [xs[i] for i in idx]  # noqa: E731
        return Problem(Resolved(pick(r.positions), pick(r.configs), pick(r.engines), pick(r.saturate),
                                pick(r.metrics), pick(r.attention), pick(r.depth)), self.measured[idx], self.sources[idx],
                       self.engines[idx], pick(self.rows))


def build_problem(dataset: Dataset, db: Database) -> Problem:
    """Resolve the usable rows once; rows that do not resolve or do not fit are left out."""
    rows = dataset.usable()
    resolved, out = resolve_rows(rows, db)
    results = predict_resolved(resolved)
    keep = [j for j, r in enumerate(results) if r["fits"]]
    problem = Problem(resolved, np.array([float(rows[i]["value"]) for i in resolved.positions]),
                      np.array([rows[i]["source"] for i in resolved.positions]), np.array(resolved.engines),
                      [rows[i] for i in resolved.positions])
    return problem.subset(np.isin(np.arange(len(resolved.configs)), keep))


def _log_errors(problem: Problem, params: dict[str, EngineDefaults]) -> np.ndarray:
    predicted = predicted_values(problem.resolved, predict_resolved(problem.resolved, params))
    return np.log(predicted / problem.measured)


GENERIC = "generic"   # the unnamed engine keeps the documented priors: nothing is fitted to it


def fit_engine(problem: Problem, name: str) -> EngineDefaults:
    """Bounded least squares of one engine's parameters on its rows; the priors when it has none.

    Without rows the answer is the prior, never the engine's shipped (fitted) parameters, so a
    cross-validation fold cannot see the source it holds out.
    """
    from scipy.optimize import least_squares  # the fit needs scipy; predictions do not

    rows = problem.subset(problem.engines == name)
    if not len(rows.measured) or name == GENERIC:
        return parameters_from(PRIOR)

    def residuals(log_theta):
        theta = np.exp(log_theta)
        data = _log_errors(rows, {name: parameters_from(theta)})
        return np.concatenate([data, PRIOR_WEIGHT * (log_theta - np.log(PRIOR))])

    start = np.clip(PRIOR, LOWER, UPPER)
    result = least_squares(residuals, np.log(start), bounds=(np.log(LOWER), np.log(UPPER)), x_scale=1.0,
                           diff_step=1e-3, max_nfev=200)
    return parameters_from(np.exp(result.x))


def fit_all(problem: Problem) -> dict[str, EngineDefaults]:
    return {name: fit_engine(problem, name) for name in sorted(set(problem.engines))}
