"""Leave-one-source-out cross-validation: each source's rows predicted by a fit that never saw them."""

from __future__ import annotations

import numpy as np

from estimator.validation.fitting import Problem, fit_engine
from estimator.validation.resolved import predicted_array
from estimator.validation.workers import map_in_workers


def cross_validate(problem: Problem, only: list[str] | None = None, jobs: int | None = None,
                   progress=None) -> np.ndarray:
    """Leave-one-source-out held-out predictions, in each row's metric unit (NaN outside ``only``).

    Each engine the held-out rows use is refitted, from the prior, on the other sources' rows; an engine
    left without rows (its only source held out) gets the documented prior, never its shipped profile,
    which was fitted on every source, the held-out one included. Engines the held-out rows do not use
    are not fitted: they could not change these predictions. The folds run in ``jobs`` worker processes
    (:func:`~estimator.validation.workers.map_in_workers`), which call ``progress(done, total)`` per fold.
    """
    sources = sorted(only or set(problem.sources))
    # the longest folds first, so that no worker is left with a long one at the end: a fold's time is its
    # engines' fits, which grow with their rows
    engine_rows = {e: int((problem.engines == e).sum()) for e in set(problem.engines)}
    sources.sort(key=lambda s: -sum(engine_rows[e] for e in set(problem.engines[problem.sources == s])))
    held_out = np.full(len(problem.measured), np.nan)
    for source, predicted in zip(sources, map_in_workers(_fold, problem, sources, jobs, progress)):
        held_out[problem.sources == source] = predicted
    return held_out


def _fold(problem: Problem, source: str) -> np.ndarray:
    """The held-out source's predictions, by engines fitted on every other source."""
    test = problem.sources == source
    train = problem.subset(~test)
    params = {name: fit_engine(train, name) for name in sorted(set(problem.engines[test]))}
    return predicted_array(problem.subset(test).resolved, params)
