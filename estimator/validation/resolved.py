"""Resolved rows evaluated together: each group of rows that share an engine and its serving options is one
call of the estimate over columns, and a fit evaluates the same groups many times with other parameters.

:func:`~estimator.validation.predict.resolve_rows` makes a :class:`Resolved` from a CSV's rows; the groups, their
columns and the batch each row runs at are worked out once and kept in it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from estimator.efficiency.defaults import PHYSICAL_LIMIT, EngineDefaults
from estimator.efficiency.engine_profiles import engine
from estimator.evaluation.configurations import Configuration, ConfigurationColumns
from estimator.serving.workload import ServingOptions


@dataclass
class Resolved:
    """Rows that resolved, with their configurations and engines, ready to evaluate many times."""

    positions: list[int] = field(default_factory=list)          # index of each resolved row in the input
    configs: list[Configuration] = field(default_factory=list)
    engines: list[str] = field(default_factory=list)            # engine profile name per resolved row
    serving: list[ServingOptions] = field(default_factory=list)  # attention, cached context, offload, load
    saturate: list[bool] = field(default_factory=list)          # offline: the largest batch that fits
    batch_caps: list[float] = field(default_factory=list)       # the engine's max_num_seqs (inf: none)
    profiled_sequences: list[float] = field(default_factory=list)  # its cap whatever the load (sampler warm-up)
    requests_at_once: list[float] = field(default_factory=list)  # an all-at-once run's requests (0: none)
    scheduling: list[tuple] = field(default_factory=list)       # its runtime's scheduling, where it differs
    metrics: list[str] = field(default_factory=list)
    columns: list[tuple[str, float]] = field(default_factory=list)  # result column and factor per row
    cache: dict = field(default_factory=dict, repr=False, compare=False)  # prepared columns, per group


def predict_resolved(resolved: Resolved, parameters: dict[str, EngineDefaults] | None = None,
                     physical_limit: bool = False) -> list[dict]:
    """Results per resolved row, each engine's rows with its parameters (overridable, for fitting).

    With ``physical_limit``, every row at 100% of datasheet bandwidth and peak with no overheads (the batch
    of an offline row is still the engine's largest that fits).
    """
    results: list[dict] = [{} for _ in resolved.configs]
    for idx, columns, batch, _ in _evaluated_groups(resolved, parameters, physical_limit):
        for j, i in enumerate(idx):
            results[i] = {k: v[j] for k, v in columns.items()}
            results[i]["batch_used"] = int(batch[j])
    return results


def predicted_array(resolved: Resolved, parameters: dict[str, EngineDefaults] | None = None) -> np.ndarray:
    """Each resolved row's prediction in its metric's unit (the fast path a fit calls many times)."""
    out = np.full(len(resolved.configs), np.nan)
    for _, columns, _, readout in _evaluated_groups(resolved, parameters, False):
        for column, factor, within, rows in readout:
            out[rows] = np.asarray(columns[column], dtype=float)[within] * factor
    return out


def _evaluated_groups(resolved: Resolved, parameters, physical_limit: bool):
    """(row indices, result columns, batch used, readout) per group of rows sharing an engine,
    ServingOptions.shared() and the scheduling of the runtime the row ran (the one it states, else its release's
    default: :meth:`EngineProfile.scheduling_at`), on top of the engine's parameters: the efficiencies are one set
    across runtimes and releases."""
    for (name, serving, scheduling), (idx, prepared, batch, columns, readout) in _prepared_groups(
            resolved, physical_limit).items():
        params = PHYSICAL_LIMIT if physical_limit else (parameters or {}).get(name) or engine(name).parameters
        params = params.model_copy(update=dict(scheduling)) if scheduling else params
        yield idx, prepared.results(serving, params, batch, columns), batch, readout


def _prepared_groups(resolved: Resolved, physical_limit: bool) -> dict:
    """Rows grouped by engine and shared serving options (each keeps its own prefix, attention and micro-batch),
    as columns, with the batch each is evaluated at and where its result columns go (cached).

    An offline row (no batch, no load) runs at the largest batch whose KV cache fits, which depends on
    memory only, never on the engine's efficiencies.
    """
    key = ("physical" if physical_limit else "engine")
    if key not in resolved.cache:
        groups = {}
        keys = [(name, serving.shared(), scheduling)
                for name, serving, scheduling in zip(resolved.engines, resolved.serving, resolved.scheduling)]
        for group in dict.fromkeys(keys):
            idx = [i for i, k in enumerate(keys) if k == group]
            prepared = ConfigurationColumns.of([resolved.configs[i] for i in idx], physical_limit)
            columns = ServingOptions.stacked_columns([resolved.serving[i] for i in idx])
            columns["profiled_sequences"] = np.array([resolved.profiled_sequences[i] for i in idx])
            batch = prepared.batch.copy()
            saturate = np.array([resolved.saturate[i] for i in idx], dtype=bool)
            if saturate.any():   # as many sequences as the KV cache holds, up to the scheduler's cap
                first = prepared.results(group[1], engine(group[0]).parameters, serving_columns=columns)
                cap = np.array([resolved.batch_caps[i] for i in idx])
                batch = np.where(saturate, np.maximum(np.minimum(first["max_batch"], cap), 1).astype(int), batch)
            # where each result column goes: (column, factor to the metric's unit, positions in the group, rows)
            metrics = [resolved.columns[i] for i in idx]
            readout = [(column, factor, within, np.asarray(idx)[within]) for column, factor in dict.fromkeys(metrics)
                       for within in [np.flatnonzero([m == (column, factor) for m in metrics])]]
            groups[group] = (idx, prepared, batch, columns, readout)
        resolved.cache[key] = groups
    return resolved.cache[key]


def predicted_values(resolved: Resolved, results: list[dict]):
    """Each resolved row's prediction in its metric's unit."""
    return np.array([float(r[column]) * factor for r, (column, factor) in zip(results, resolved.columns)])
