"""Calibrating the 80% prediction intervals on held-out residuals, without looking at the rows judged.

Residuals are log(measured / predicted speed) of leave-one-source-out predictions (time metrics
inverted), so each comes from a fit that never saw its row. A table of cells (regime, engine, device
group, format family, backend; see :mod:`estimator.evaluation.intervals`) holds their 10th, 50th and 90th
percentiles, rows and sources; a row's band is read through its cells with hierarchical shrinkage (each
cell weighed by its sources) and widened by a factor ``k`` per phase, capped by the physical roofline.

``k`` is chosen by inner folds of one source each: each training source's rows are judged against
a table built from the other training sources, and ``k`` is the smallest value on a grid whose
coverage reaches 80%. (Five folds of sources dealt alphabetically made ``k`` hang on the sources'
names: one more source reshuffled the folds and moved the prefill width from 3.5x to 4.5x. One
source per fold gives the same coverage with narrower bands: prefill 3.15x against 3.53x, at 83%.)
To report honest coverage, every source is judged against a table and a ``k`` built from the other
sources only (a nested loop; no refits, since the residuals are already held out).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from estimator.evaluation.intervals import cell_key, shrunk_quantiles
from estimator.validation.workers import map_in_workers

TARGET_COVERAGE = 0.80
LEVELS = (0.10, 0.50, 0.90)
# Pseudo-sources a cell borrows from its parent (hierarchical shrinkage, cells weighed by their sources):
# chosen among 8, 10, 15, 20 and 30, and against weighing rows (10 pseudo-rows, or up to 1.5, 2 or 3 rows
# per source), on the held-out figures: 10 gave the narrowest decode and prefill bands at 78% and 82%
# coverage (docs/architecture.md, "Cells part where the errors do").
PRIOR_SOURCES = 10.0
MIN_CELL_ROWS = 3          # fewer rows than this: the cell is its parent
WIDENING_GRID = np.round(np.arange(0.8, 4.01, 0.05), 2)


@dataclass
class Residuals:
    """Held-out residuals, one per row, with what the intervals are conditioned on."""

    log_ratio: np.ndarray      # log(measured / predicted speed)
    log_cap: np.ndarray        # log(physical-limit speed / predicted speed): no band reaches above it
    paths: list                # cell path per row, most general first
    phases: np.ndarray         # decode, prefill, throughput or serving: k is chosen per phase
    sources: np.ndarray

    @cached_property
    def cell_rows(self) -> dict[str, tuple[np.ndarray, list]]:
        """Each cell's rows (finite residuals), in increasing order of their residuals, and its table entry over
        all of them."""
        groups: dict[str, list[int]] = {}
        for i in np.flatnonzero(np.isfinite(self.log_ratio)):
            for key in self.row_cells[i]:
                groups.setdefault(key, []).append(i)
        cells = {}
        for key, idx in groups.items():
            idx = np.array(idx)[np.argsort(self.log_ratio[idx], kind="stable")]
            cells[key] = (idx, _entry(self, idx))
        return cells

    @cached_property
    def row_cells(self) -> list[list[str]]:
        """Each row's cell keys, most general first."""
        return [[cell_key(cell) for cell in path] for path in self.paths]

    @cached_property
    def path_ids(self) -> np.ndarray:
        """Each row's path as an integer: rows with one path get one band from one table."""
        ids: dict[tuple, int] = {}
        return np.array([ids.setdefault(tuple(keys), len(ids)) for keys in self.row_cells])

    @cached_property
    def source_codes(self) -> np.ndarray:
        """Each row's source as an integer (to count a cell's sources)."""
        return np.unique(self.sources, return_inverse=True)[1]


def _entry(r: Residuals, idx: np.ndarray) -> list:
    """A cell's 10th, 50th and 90th percentiles, rows and sources, from its rows in increasing order of residual
    (np.quantile's default, linear interpolation, without its sort)."""
    values = r.log_ratio[idx]
    position = np.asarray(LEVELS) * (len(values) - 1)
    below = np.floor(position).astype(int)
    above = np.minimum(below + 1, len(values) - 1)
    fraction, low, high = position - below, values[below], values[above]
    # interpolated from the nearer end, as numpy's _lerp does, so the percentiles are np.quantile's to the last bit
    quantiles = np.where(fraction >= 0.5, high - (high - low) * (1 - fraction), low + (high - low) * fraction)
    return [*(round(float(v), 5) for v in quantiles), len(idx),
            int(np.count_nonzero(np.bincount(r.source_codes[idx])))]


def build_cells(r: Residuals, mask: np.ndarray) -> dict:
    """Percentiles of the residuals, rows and sources in every cell with enough rows among ``mask``.

    The nested leave-one-source-out loops build thousands of tables, each leaving out a source or two: only the
    cells that hold a row ``mask`` drops are worked out again; every other keeps its entry over all rows, computed
    once.
    """
    cells = r.cell_rows
    dropped = np.flatnonzero(np.isfinite(r.log_ratio) & ~mask)
    changed = {key for i in dropped for key in r.row_cells[i]}
    table = {key: whole for key, (idx, whole) in cells.items() if key not in changed and len(idx) >= MIN_CELL_ROWS}
    for key in changed:
        idx = cells[key][0]
        kept = idx[mask[idx]]
        if len(kept) >= MIN_CELL_ROWS:
            table[key] = _entry(r, kept)
    return table


def log_bands(r: Residuals, cells: dict, rows: np.ndarray, widening, grid: bool = False):
    """Low and high log ratio of each row's band (NaN where its regime has no cells), capped by physics.

    ``widening`` is one factor per row, or with ``grid`` a grid of factors (one column per factor).
    """
    k = np.asarray(widening, dtype=float)
    paths, first, each = np.unique(r.path_ids[rows], return_index=True, return_inverse=True)
    q = np.array([_quantiles(cells, r.paths[rows[i]]) for i in first]).reshape(len(paths), 3)[each]
    low, mid, high = (q[:, j:j + 1] if grid else q[:, j] for j in range(3))
    cap = r.log_cap[rows][:, None] if grid else r.log_cap[rows]
    return mid + k * (low - mid), np.minimum(mid + k * (high - mid), cap)


def _quantiles(cells: dict, path) -> np.ndarray:
    q = shrunk_quantiles(cells, path, PRIOR_SOURCES)
    return np.full(3, np.nan) if q is None else q


def choose_widening(r: Residuals, mask: np.ndarray) -> dict[str, float]:
    """Per phase, the smallest k whose coverage, each source in ``mask`` judged on the others, reaches 80%."""
    mask = mask & np.isfinite(r.log_ratio)
    sources = sorted(set(r.sources[mask]))
    fold_of = {s: i for i, s in enumerate(sources)}   # one source per fold
    folds = np.array([fold_of.get(s, -1) for s in r.sources])
    inside = np.zeros((len(r.log_ratio), len(WIDENING_GRID)), dtype=bool)
    judged = np.zeros(len(r.log_ratio), dtype=bool)
    for fold in range(len(sources)):
        test = mask & (folds == fold)
        cells = build_cells(r, mask & (folds != fold))
        rows = np.flatnonzero(test)
        low, high = log_bands(r, cells, rows, WIDENING_GRID, grid=True)
        ok = ~np.isnan(low[:, 0])
        inside[rows[ok]] = (low[ok] <= r.log_ratio[rows[ok], None]) & (r.log_ratio[rows[ok], None] <= high[ok])
        judged[rows[ok]] = True
    widening = {}
    for phase in sorted(set(r.phases[mask])):
        rows = judged & (r.phases == phase)
        coverage = inside[rows].mean(axis=0) if rows.any() else np.ones(len(WIDENING_GRID))
        reached = np.flatnonzero(coverage >= TARGET_COVERAGE)
        widening[str(phase)] = float(WIDENING_GRID[reached[0] if len(reached) else -1])
    return widening


@dataclass
class HeldOutBands:
    """Every row's 80% band built without its own source: what coverage and width are judged on."""

    low: np.ndarray            # ratio measured / predicted speed at the band's ends (NaN: no band)
    high: np.ndarray
    inside: np.ndarray


def held_out_bands(r: Residuals, jobs: int | None = None) -> HeldOutBands:
    """For each source, a table and per-phase k from the other sources only; its rows judged against them.
    The sources run in ``jobs`` worker processes (:mod:`estimator.validation.workers`)."""
    n = len(r.log_ratio)
    low, high = np.full(n, np.nan), np.full(n, np.nan)
    sources = sorted(set(r.sources[np.isfinite(r.log_ratio)]))
    for rows, source_low, source_high in map_in_workers(_source_bands, r, sources, jobs):
        low[rows], high[rows] = source_low, source_high
    inside = (low <= r.log_ratio) & (r.log_ratio <= high)
    return HeldOutBands(np.exp(low), np.exp(high), inside)


def _source_bands(r: Residuals, source: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One source's rows and their log bands, from a table and widening built on the other sources."""
    finite = np.isfinite(r.log_ratio)
    train, rows = finite & (r.sources != source), np.flatnonzero(finite & (r.sources == source))
    widening = choose_widening(r, train)
    k = np.array([widening.get(str(p), WIDENING_GRID[-1]) for p in r.phases[rows]])
    return (rows, *log_bands(r, build_cells(r, train), rows, k))


def shipped_table(r: Residuals) -> dict:
    """The table every estimate reads: cells from all held-out residuals, k chosen over inner folds."""
    everything = np.isfinite(r.log_ratio)
    return {"cells": build_cells(r, everything), "widening_by_phase": choose_widening(r, everything),
            "prior_sources": PRIOR_SOURCES, "levels": list(LEVELS)}
