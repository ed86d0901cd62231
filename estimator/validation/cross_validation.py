"""Leave-one-source-out cross-validation: each source's rows predicted by a fit that never saw them."""

from __future__ import annotations

import numpy as np

from estimator.validation.fitting import Problem, fit_all
from estimator.validation.predict import predict_resolved, predicted_values


def cross_validate(problem: Problem, only: list[str] | None = None) -> np.ndarray:
    """Leave-one-source-out held-out predictions, in each row's metric unit (NaN outside ``only``)."""
    held_out = np.full(len(problem.measured), np.nan)
    for source in sorted(only or set(problem.sources)):
        test = problem.sources == source
        params = fit_all(problem.subset(~test))
        part = problem.subset(test)
        held_out[test] = predicted_values(part.resolved, predict_resolved(part.resolved, params))
    return held_out
