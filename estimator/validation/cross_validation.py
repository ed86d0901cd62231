"""Leave-one-source-out cross-validation: each source's rows predicted by a fit that never saw them."""

from __future__ import annotations

import numpy as np

from estimator.validation.fitting import Problem, fit_engine
from estimator.validation.predict import predicted_array


def cross_validate(problem: Problem, only: list[str] | None = None) -> np.ndarray:
    """Leave-one-source-out held-out predictions, in each row's metric unit (NaN outside ``only``).

    Each engine the held-out rows use is refitted, from the prior, on the other sources' rows; an engine
    left without rows (its only source held out) gets the documented prior, never its shipped profile,
    which was fitted on every source, the held-out one included. Engines the held-out rows do not use
    are not fitted: they could not change these predictions.
    """
    held_out = np.full(len(problem.measured), np.nan)
    for source in sorted(only or set(problem.sources)):
        test = problem.sources == source
        train = problem.subset(~test)
        params = {name: fit_engine(train, name) for name in sorted(set(problem.engines[test]))}
        part = problem.subset(test)
        held_out[test] = predicted_array(part.resolved, params)
    return held_out
