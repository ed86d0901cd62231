"""Results for every configuration: at a fixed batch, or in the steady state under a load.

The one entry point from columns to results that the public API, ``predict`` and
the planner share; a single estimate is a table of one row.
"""

from __future__ import annotations

import numpy as np

from estimator.efficiency.defaults import GENERIC_ENGINE, EngineDefaults
from estimator.evaluation.fixed_batch import DEFAULT_SERVING, results_at_batch
from estimator.serving.continuous_batching import max_sustainable_rate, steady_state

# Latency percentiles under a load, from estimator.serving.percentiles.
PERCENTILE_COLUMNS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_p99_s")


def compute_results(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving=None,
             engine: EngineDefaults = GENERIC_ENGINE, host=None, draft=None) -> dict[str, np.ndarray]:
    """Prefill, decode and memory for every configuration the inputs broadcast to.

    With a load in ``serving`` (``concurrency`` C or ``rate`` R, optionally
    ``chunk_tokens``), the batch is not an input: the steady-state decode batch
    of continuous batching is found first (:mod:`estimator.serving.continuous_batching`) and every
    result is given at that batch, with TTFT including queueing. Otherwise
    :func:`~estimator.evaluation.fixed_batch.results_at_batch` runs at batch ``B``. Parameters are those of
    :func:`results_at_batch`.
    """
    serving = {**DEFAULT_SERVING, **(serving or {})}
    if not (serving["concurrency"] or serving["rate"]):
        return results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving, engine, host, draft)

    def at(batch):
        return results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, batch, T, O, layout, serving, engine, host,
                                draft)

    one = at(np.ones_like(np.asarray(B, dtype=float)))
    state = steady_state(lambda n: at(n)["itl_s"], one["ttft_s"], np.asarray(T, dtype=float) - serving["prefix_tokens"],
                         O, serving["concurrency"], serving["rate"], one["max_batch"], serving["chunk_tokens"])
    # a saturated engine runs full while its queue grows: report it at the largest batch that fits
    batch = np.where(state["saturated"], np.maximum(np.minimum(state["steady_batch"], one["max_batch"]), 1),
                     state["steady_batch"])
    out = at(batch)
    finite_itl = np.where(np.isfinite(state["itl_s"]) & ~state["saturated"], state["itl_s"], np.nan)
    out.update({
        "ttft_prefill_s": one["ttft_s"],
        "ttft_s": state["ttft_s"],
        "itl_s": finite_itl,
        "decode_tps_per_seq": 1.0 / finite_itl,
        "decode_tps_total": state["steady_batch"] / finite_itl,
        "e2e_latency_s": state["ttft_s"] + out["decode_steps"] * finite_itl,
        "throughput_out_tps": state["request_rate"] * np.asarray(O, dtype=float),
        "throughput_out_tps_per_gpu": state["request_rate"] * np.asarray(O, dtype=float)
        / (np.asarray(layout["tp"]) * np.asarray(layout["pp"]) * np.asarray(layout["dp"])),
        "request_rate": state["request_rate"],
        "steady_batch": batch,
        "saturated": state["saturated"],
        "max_rate": max_sustainable_rate(at(np.maximum(one["max_batch"], 1))["itl_s"], one["ttft_s"], O,
                                         np.maximum(one["max_batch"], 1)),
    })
    out["tpot_inclusive_s"] = out["e2e_latency_s"] / np.asarray(O, dtype=float)
    # percentiles of the queueing model (docs/formulas.md §14); NaN (null) when saturated
    out.update({k: np.where(state["saturated"], np.nan, state[k]) for k in PERCENTILE_COLUMNS})
    return out
