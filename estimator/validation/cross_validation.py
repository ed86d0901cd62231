"""Leave-one-source-out cross-validation: each source's rows predicted by a fit that never saw them."""

from __future__ import annotations

import numpy as np

from estimator.efficiency.engine_profiles import engine
from estimator.validation.fitting import PRIOR, Problem, fit_all, parameters_from
from estimator.validation.predict import predicted_array


def cross_validate(problem: Problem, only: list[str] | None = None) -> np.ndarray:
    """Leave-one-source-out held-out predictions, in each row's metric unit (NaN outside ``only``).

    Every engine with training rows in a fold is refitted from the prior; an engine left without rows
    (its only source held out) gets the documented prior, never its shipped profile, which was fitted
    on every source, the held-out one included.
    """
    held_out = np.full(len(problem.measured), np.nan)
    for source in sorted(only or set(problem.sources)):
        test = problem.sources == source
        params = fit_all(problem.subset(~test))
        params.update({name: parameters_from(PRIOR, engine(name).parameters.fp16_accumulate)
                       for name in set(problem.engines[test]) - set(params)})
        part = problem.subset(test)
        held_out[test] = predicted_array(part.resolved, params)
    return held_out
