"""Results for every configuration: at a fixed batch, or in the steady state under a load.

The one entry point from columns to results that the public API, ``predict`` and
the planner share; a single estimate is a table of one row.
"""

from __future__ import annotations

import numpy as np

from estimator.efficiency.defaults import GENERIC_ENGINE, EngineDefaults
from estimator.evaluation.fixed_batch import DEFAULT_SERVING, results_at_batch
from estimator.physics.memory import PREFILL_TOKEN_BUDGET
from estimator.serving.burst import all_at_once, backlog
from estimator.serving.first_wave import first_wave_ttft, last_start_s
from estimator.serving.continuous_batching import (
    MAX_UTILISATION,
    backlog_wait_s,
    max_sustainable_rate,
    steady_state,
)
from estimator.serving.lengths import LengthMix, batch_that_fits, request_spread, run_outputs
from estimator.serving.mixed_steps import MixedSteps
from estimator.serving.run_end import Residuals, finite_run_s

# Latency percentiles under a load, from estimator.serving.percentiles.
PERCENTILE_COLUMNS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_p99_s")


def compute_results(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving=None,
                    engine: EngineDefaults = GENERIC_ENGINE, host=None, draft=None,
                    end_step: bool = False) -> dict[str, np.ndarray]:
    """Prefill, decode and memory for every configuration the inputs broadcast to.

    With a load in ``serving`` (``concurrency`` C or ``rate`` R, optionally
    ``chunk_tokens``), the batch is not an input: the steady-state decode batch
    of continuous batching is found first (:mod:`estimator.serving.continuous_batching`) and every
    result is given at that batch, with TTFT including queueing. Otherwise
    :func:`~estimator.evaluation.fixed_batch.results_at_batch` runs at batch ``B``. Parameters are those of
    :func:`results_at_batch` (``end_step``: also the last decode step's time, ``itl_end_s``).
    """
    serving = {**DEFAULT_SERVING, **(serving or {})}
    mix = serving["length_mix"]
    # with a length mix, decode and memory run at the lengths of the batch's (length-biased) mean sequence
    T_run, O_run = (T, O) if mix is None else (np.asarray(T, dtype=float) * 0 + v for v in mix.decode_lengths())
    if not (serving["concurrency"] or serving["rate"]):
        if serving["num_requests"]:
            def at_once(batch, prompts=T_run, outputs=O_run):
                return results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, batch, prompts, outputs, layout,
                                        serving, engine, host, draft, end_step)
            return _all_at_once_results(at_once, T, O, layout, serving, engine, mix)
        return results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, B, T, O, layout, serving, engine, host, draft,
                                end_step)

    def at(batch, prompts=T_run, outputs=O_run, expand=lambda d: d, itl_only=False):
        return results_at_batch(expand(m), expand(hw), expand(f), expand(kv), expand(peak_linear_flops_per_s), batch,
                                prompts, outputs, expand(layout), expand(serving), engine, expand(host), expand(draft),
                                itl_only=itl_only)

    # Each of the dp replicas is its own engine serving 1/dp of the load: the steady state is solved
    # per replica (batches, concurrency and rate divided by dp) and scaled back up.
    dp = np.asarray(layout["dp"], dtype=float)
    one = at(dp + 0 * np.asarray(B, dtype=float))          # one prompt on each replica
    requests = _requests(one) if mix is None else _requests_of_mix(at, dp, T_run, mix)
    max_batch = _running_limit(one["max_batch"] / dp, T_run, O_run, mix, engine)
    slots = np.maximum(np.minimum(max_batch, serving["max_num_seqs"]), 1)
    full = at(slots * dp)
    prompt_tokens = np.asarray(T, dtype=float) - requests["cached_tokens"]
    mixed = None if engine.prefill_runs_alone else _mixed_steps(one, full, prompt_tokens, slots, engine)
    # prompts that queue are prefilled together and share the launch of the pass (steady_state)
    capacity = max_sustainable_rate(full["itl_s"], requests["prefill_s"] - requests["launch_excess_s"], O, slots) \
        if mixed is None else \
        mixed.capacity(full["itl_s"], prompt_tokens, O)                                          # per replica
    # a finite benchmark (num_requests) offered more than that runs at capacity while its backlog grows
    rate = serving["rate"] / dp
    requests_run = np.asarray(serving["num_requests"], dtype=float) / dp
    finite = (requests_run > 0) & (rate > 0)
    clients = serving["concurrency"] / dp
    # N > C here (ServingOptions.columns sends N <= C all at once): the first C at once, then a closed loop
    closed_run = (requests_run > 0) & (clients > 0)
    served = np.where(finite, np.minimum(rate, MAX_UTILISATION * capacity), rate)
    backlog = {q: backlog_wait_s(requests_run, np.where(finite, rate, 0.0), capacity, slots, p)
               for q, p in (("mean", None), ("p50", 0.5), ("p90", 0.9), ("p99", 0.99))}
    state = steady_state(lambda n: at(n * dp, itl_only=True)["itl_s"], requests["prefill_s"], prompt_tokens, O,
                         serving["concurrency"] / dp, served, max_batch, serving["chunk_tokens"],
                         prefill_scv=requests["scv"], max_num_seqs=serving["max_num_seqs"], mixed=mixed,
                         launch_excess_s=requests["launch_excess_s"])
    steady = state["steady_batch"] * dp
    # a saturated engine runs full while its queue grows: report it at the largest batch that fits
    batch = np.where(state["saturated"], np.maximum(np.minimum(steady, np.floor(max_batch) * dp), dp), steady)
    # a finite run of fewer requests than that batch never reaches it: its steps run at most its own requests
    short = finite & (batch > requests_run * dp)
    steady_itl = at(batch, itl_only=True)["itl_s"] if np.any(short) else None
    batch = np.where(short, np.maximum(requests_run, 1.0) * dp, batch)
    steady = np.where(short, batch, steady)
    out = results_at_batch(m, hw, f, kv, peak_linear_flops_per_s, batch, T_run, O_run, layout, serving, engine,
                           host, draft, end_step)
    finite_itl = np.where(np.isfinite(state["itl_s"]) & ~state["saturated"], state["itl_s"], np.nan)
    # the same share of prompts in a step of the run's own batch
    own_batch = 1.0 if steady_itl is None else np.where(short, out["itl_s"] / steady_itl, 1.0)
    finite_itl = finite_itl * own_batch
    if end_step:   # the last step of a generation, with the same prefill stalls as the mean step
        out["itl_end_s"] = out["itl_end_s"] * finite_itl / out["itl_s"]
    request_rate = state["request_rate"] * dp
    # a finite benchmark reports its output tokens over its duration: its last request arrives (or, behind a
    # backlog, starts) at (n − 1) / X, and the run ends with the longest reply left, in a thinning batch
    X = np.maximum(state["request_rate"], 1e-300)
    ends = finite | closed_run
    duration_s = np.full(np.shape(ends), np.nan) if not np.any(ends) else \
        finite_run_s(requests_run, X, finite_itl, state["ttft_s"], one["itl_s"], out["itl_s"], batch / dp,
                     *_residuals(mix, np.maximum(np.asarray(O, dtype=float) - 1, 0)),
                     last_start_s=np.where(closed_run, last_start_s(requests_run, clients, X, _output_scv(mix)),
                                           (requests_run - 1) / X))
    over_run = np.where(ends, requests_run / X / duration_s, 1.0)
    out.update({
        "ttft_prefill_s": requests["prefill_s"],
        "kv_tier_load_s": one["kv_tier_load_s"],      # per prompt, as the prefill above
        "ttft_s": state["ttft_s"] + backlog["mean"],
        "backlog_wait_s": backlog["mean"],
        "itl_s": finite_itl,
        "decode_tps_per_seq": 1.0 / finite_itl,
        "decode_tps_total": steady / finite_itl,
        "e2e_latency_s": state["ttft_s"] + backlog["mean"] + np.maximum(np.asarray(O, dtype=float) - 1, 0)
        * finite_itl,
        "throughput_out_tps": request_rate * np.asarray(O, dtype=float) * over_run,
        "throughput_out_tps_per_gpu": request_rate * np.asarray(O, dtype=float) * over_run
        / (np.asarray(layout["tp"]) * np.asarray(layout["pp"]) * dp),
        "request_rate": request_rate,
        "steady_batch": batch,
        "saturated": state["saturated"],
        "queued_requests": state["queued_requests"] * dp,
        # the running-batch limit over all replicas: the KV cache's capacity or the scheduler's max_num_seqs
        "max_running_sequences": state["slots"] * dp,
        "max_rate": capacity * dp,
        "run_duration_s": np.where(ends, duration_s, np.nan),     # a finite benchmark's; none for a steady state
        "first_wave_ttft_s": np.full(np.shape(ends), np.nan),    # a finite closed loop's first C (_first_wave)
    })
    out["tpot_inclusive_s"] = out["e2e_latency_s"] / np.asarray(O, dtype=float)
    # percentiles of the queueing model (docs/formulas.md §14); NaN (null) when saturated
    # a request's own lengths spread its TTFT and E2E beyond the queue's spread (docs/formulas.md §14)
    shifts = {f"ttft_{q}_s": requests[f"prefill_{q}_shift_s"] + backlog[q] for q in ("p50", "p90", "p99")}
    shifts["e2e_p99_s"] = requests["prefill_p99_shift_s"] + requests["output_p99_extra"] * finite_itl + backlog["p99"]
    out.update({k: np.where(state["saturated"], np.nan, state[k] * (own_batch if k.startswith("itl") else 1.0)
                            + shifts.get(k, 0.0)) for k in PERCENTILE_COLUMNS})
    if np.any(closed_run):
        _first_wave(out, at, one, requests, T, O, layout, np.minimum(clients, slots), requests_run, engine, mix)
    if engine.allocates_kv_on_demand:   # the running sequences hold their current lengths, not their final ones
        _hold_current_lengths(out, T_run, O_run)
    if mix is not None or engine.allocates_kv_on_demand:
        out["max_batch"] = out["max_concurrency"] = np.floor(max_batch) * dp
    if serving["concurrency"] and engine.prefill_runs_alone and mix is None and not serving["chunk_tokens"]:
        _in_lockstep(out, at, one, T, O, layout, clients, requests_run, np.floor(slots), engine)
    return out


def _running_limit(fits_at_final, T, O, mix: LengthMix | None, engine: EngineDefaults):
    """The most sequences the KV cache runs at once, per replica, from ``fits_at_final``, the batch whose caches
    fit at the final length of (``T``, ``O``), the decode batch's lengths (docs/formulas.md §14, "The running-batch
    limit"). An engine that reserves each request's final length fits the N with N μ + z √N σ within the cache,
    μ and σ those of the final lengths; one that allocates blocks as tokens come holds the running sequences'
    current lengths, whose mean over a request's decode is P + O/2 (σ: a length mix's, or O/√12 of equal requests
    at evenly spread progress)."""
    final, current = _final_and_held_tokens(T, O)
    if not engine.allocates_kv_on_demand:
        return fits_at_final if mix is None else batch_that_fits(fits_at_final, final, mix.final_length_spread())
    spread = np.asarray(O, dtype=float) / np.sqrt(12) if mix is None else mix.current_length_spread()
    return batch_that_fits(fits_at_final * final / current, current, spread)


def _hold_current_lengths(out: dict, T, O) -> None:
    """The memory of a steady batch on an engine that allocates KV as tokens come: its sequences hold P + O/2
    tokens on average rather than the P + O the fixed-batch memory counts (``_running_limit``)."""
    final_tokens, held_tokens = _final_and_held_tokens(T, O)
    final = out["memory_kv_cache_bytes"]
    held = final * held_tokens / final_tokens
    out["memory_kv_cache_bytes"] = held
    out["memory_required_bytes"] = out["memory_required_bytes"] - final + held
    out["fits"] = out["memory_required_bytes"] <= out["memory_available_bytes"]


def _final_and_held_tokens(T, O) -> tuple[np.ndarray, np.ndarray]:
    """A sequence's final length P + O, and the length it holds on average over its decode, P + O/2."""
    T, O = np.asarray(T, dtype=float), np.asarray(O, dtype=float)
    return T + O, T + O / 2


def _output_scv(mix: LengthMix | None) -> float:
    """c² of a request's time in the system, taken as its output length's (the decode dominates it): 0 when
    every request is alike."""
    return 0.0 if mix is None else float(mix.output_tokens.var() / mix.mean_output_tokens ** 2)


def _residuals(mix: LengthMix | None, steps) -> tuple[Residuals, np.ndarray]:
    """The decode steps of a run's requests for :func:`~estimator.serving.run_end.finite_run_s`: the mix's
    own, or every request's O − 1 (tabulated as 1, scaled by O − 1)."""
    if mix is None:
        return Residuals.of(np.ones(1)), steps
    return Residuals.of(np.maximum(mix.output_tokens - 1, 0)), np.ones_like(steps)


def _in_lockstep(out: dict, at, one: dict, T, O, layout, clients, requests_run, slots,
                 engine: EngineDefaults) -> None:
    """A closed loop of C clients with equal lengths on an engine whose prefill steps run alone and first: the
    C requests start together, are prefilled before any decodes, decode in one batch and finish on the same
    step, so all C send again at once. The loop repeats an all-at-once run of C (docs/formulas.md §14,
    "Closed loops in lockstep"), where it holds them all (C ≤ S); ``out`` is updated there."""
    dp = np.asarray(layout["dp"], dtype=float)
    fits = clients <= slots
    if not np.any(fits):
        return
    run, _, _ = _run_at_once(at, one, T, O, np.where(fits, clients, 1.0), dp, engine)
    cycles_per_s = 1.0 / run["duration_s"]
    lockstep = {**_run_columns(run, O, layout), "request_rate": clients * dp * cycles_per_s,
                # a finite loop of N requests (N > C) runs N/C such cycles
                "run_duration_s": np.where(requests_run > 0, requests_run / clients * run["duration_s"], np.nan),
                "first_wave_ttft_s": np.where(requests_run > 0, run["ttft_s"], np.nan),
                "steady_batch": clients * dp, "queued_requests": 0.0 * clients, "backlog_wait_s": 0.0 * clients,
                **{k: run[k] for k in PERCENTILE_COLUMNS}}
    out.update({k: np.where(fits, v, out[k]) for k, v in lockstep.items()})


def _first_wave(out: dict, at, one: dict, requests: dict, T, O, layout, wave, requests_run, engine: EngineDefaults,
                mix: LengthMix | None) -> None:
    """A closed loop of N requests through C clients starts them together: the first C (``wave``, per replica,
    at most the running limit) are an all-at-once run, a share C/N of the requests, the rest the steady state
    in ``out`` (:mod:`estimator.serving.first_wave`). Updates the TTFT mean and quantiles, and E2E with them."""
    dp = np.asarray(layout["dp"], dtype=float)
    run, _, _ = _run_at_once(at, one, T, O, wave, dp, engine, mix)
    steady_ttft = {k: out[k] for k in ("ttft_s", "ttft_p99_s")}
    mixed = first_wave_ttft(wave / requests_run, run, out, requests["prefill_s"])
    out.update({k: np.where(np.isnan(out[k]), np.nan, v) for k, v in mixed.items()})   # none where saturated
    out["first_wave_ttft_s"] = run["ttft_s"] + 0 * out["ttft_s"]         # broadcast to every row
    out["e2e_latency_s"] = out["e2e_latency_s"] + out["ttft_s"] - steady_ttft["ttft_s"]
    out["tpot_inclusive_s"] = out["e2e_latency_s"] / np.asarray(O, dtype=float)
    # the slowest requests are the wave's: their E2E tail grows by as much as the TTFT tail
    out["e2e_p99_s"] = out["e2e_p99_s"] + np.maximum(out["ttft_p99_s"] - steady_ttft["ttft_p99_s"], 0.0)


def _run_at_once(at, one: dict, T, O, requests, dp, engine: EngineDefaults,
                 mix: LengthMix | None = None) -> tuple[dict, dict, dict]:
    """:func:`~estimator.serving.burst.all_at_once` for ``requests`` per replica, all running; the results at
    that batch (its decode step), and those its prompts are prefilled at (with a length mix, at its mean lengths
    ``T``, ``O`` rather than the decode batch's length-biased ones). With a mix the requests' outputs are its order
    statistics (:func:`~estimator.serving.lengths.run_outputs`): the run lasts until the longest ends."""
    out = at(np.ceil(requests) * dp)
    prompts = out if mix is None else at(np.ceil(requests) * dp, T, O)
    prompt = np.asarray(T, dtype=float) - prompts["cached_tokens"]
    return all_at_once(requests, prompts["ttft_s"], prompt, O, _step_tokens(prompt, engine), one["itl_s"],
                       out["itl_s"], not engine.prefill_runs_alone,
                       None if mix is None else run_outputs(mix, np.ceil(requests))), out, prompts


def _step_tokens(prompt_tokens, engine: EngineDefaults):
    """The most prompt tokens one step takes: the engine's chunk, else whole prompts up to the usual step
    budget."""
    chunk = np.inf if engine.prefill_chunk_tokens is None else float(engine.prefill_chunk_tokens)
    return np.minimum(chunk, np.maximum(prompt_tokens, PREFILL_TOKEN_BUDGET))


def _mixed_steps(one: dict, full: dict, prompt_tokens, slots, engine: EngineDefaults) -> MixedSteps:
    """How arriving prompts ride in the decode steps of an engine that mixes them, from the results at one
    sequence and at the S slots (:class:`~estimator.serving.mixed_steps.MixedSteps`)."""
    prompts = np.maximum(np.floor(slots) * prompt_tokens, 1.0)       # S prompts as one batch: T_pf(S)
    return MixedSteps(token_s=full["ttft_s"] / prompts, token_linear_s=full["prefill_linear_s"] / prompts,
                      decode_linear_s=(one["decode_linear_s"], full["decode_linear_s"]), slots=np.floor(slots),
                      step_tokens=_step_tokens(prompt_tokens, engine))


def _run_columns(run: dict, O, layout) -> dict:
    """Result columns of an all-at-once run (per replica) over all replicas."""
    dp = np.asarray(layout["dp"], dtype=float)
    return {"ttft_s": run["ttft_s"], "itl_s": run["itl_mean_s"], "decode_tps_per_seq": 1.0 / run["itl_mean_s"],
            "e2e_latency_s": run["e2e_latency_s"],
            "tpot_inclusive_s": run["e2e_latency_s"] / np.asarray(O, dtype=float),
            "throughput_out_tps": run["throughput_out_tps"] * dp, "decode_tps_total": run["throughput_out_tps"] * dp,
            "throughput_out_tps_per_gpu": run["throughput_out_tps"] * dp
            / (np.asarray(layout["tp"]) * np.asarray(layout["pp"]) * dp)}


def _all_at_once_results(at, T, O, layout, serving, engine: EngineDefaults, mix: LengthMix | None = None) -> dict:
    """``num_requests`` N sent at once, no load (docs/formulas.md §14, "All-at-once runs"). The engine runs
    S = min(N_kv, max_num_seqs) sequences per replica; when it holds all N the run is the two phases of
    :func:`~estimator.serving.burst.all_at_once`; beyond, it refills freed slots from a steady backlog
    (:func:`~estimator.serving.burst.backlog`). With a length mix, ``at`` runs at the decode batch's lengths,
    the prompts are prefilled at their mean length, and S is the batch whose lengths' tail fits."""
    dp = np.asarray(layout["dp"], dtype=float)
    one = at(dp)                                                  # one sequence on each replica
    kv_batch = one["max_batch"] / dp if mix is None else \
        batch_that_fits(one["max_batch"] / dp, float(sum(mix.decode_lengths())), mix.final_length_spread())
    slots = np.maximum(np.floor(np.minimum(kv_batch, serving["max_num_seqs"])), 1.0)
    requests = serving["num_requests"] / dp
    fits_all = requests <= slots
    run, out, prompts = _run_at_once(at, one, T, O, np.minimum(requests, slots), dp, engine, mix)
    if not np.all(fits_all):
        prompt = np.asarray(T, dtype=float) - prompts["cached_tokens"]
        queued = backlog(requests, slots, prompts["ttft_s"], prompts["prefill_linear_s"], prompt, O,
                         _step_tokens(prompt, engine), (one["itl_s"], out["itl_s"]),
                         (one["decode_linear_s"], out["decode_linear_s"]), not engine.prefill_runs_alone)
        run = {k: np.where(fits_all, v, queued[k]) for k, v in run.items() if k in queued}
    out.update({**_run_columns(run, O, layout), **{k: run[k] for k in PERCENTILE_COLUMNS},
                "prefill_phase_s": run["prefill_phase_s"], "run_duration_s": run["duration_s"],
                "running_batch": np.minimum(np.ceil(requests), slots) * dp, "max_running_sequences": slots * dp,
                "queued_requests": np.maximum(requests - slots, 0) * dp})
    if mix is not None:
        out["max_batch"] = out["max_concurrency"] = np.floor(kv_batch) * dp
    return out


def _requests(one: dict) -> dict:
    """Every request alike: one prompt's prefill, no spread."""
    zero = 0.0 * one["ttft_s"]
    return {"prefill_s": one["ttft_s"], "scv": zero, "cached_tokens": one["cached_tokens"],
            "launch_excess_s": one["prefill_launch_excess_s"],
            "prefill_p50_shift_s": zero, "prefill_p90_shift_s": zero, "prefill_p99_shift_s": zero,
            "output_p99_extra": zero}


def _requests_of_mix(at, dp, T_run, mix: LengthMix) -> dict:
    """The prefill of every request of the mix (a trailing axis), reduced by :func:`request_spread`."""
    def expand(d):
        if isinstance(d, dict):
            return {k: np.asarray(v)[..., None] if isinstance(v, np.ndarray) and v.ndim else v for k, v in d.items()}
        return np.asarray(d)[..., None] if isinstance(d, np.ndarray) and d.ndim else d

    prompts = np.asarray(T_run, dtype=float)[..., None] * 0 + mix.prompt_tokens
    outputs = np.asarray(T_run, dtype=float)[..., None] * 0 + mix.output_tokens
    each = at(np.asarray(dp)[..., None], prompts, outputs, expand)
    return {**request_spread(each["ttft_s"], mix.output_tokens), "cached_tokens": each["cached_tokens"].mean(axis=-1),
            "launch_excess_s": each["prefill_launch_excess_s"].mean(axis=-1)}
