"""The record of an engine's fit: each parameter's value, bounds, standard error, and whether it ended on a
bound or was identified by any row at all (what `validate --published --write` puts beside the parameters)."""

from __future__ import annotations

import numpy as np

from estimator.validation.fitting import (
    PARAMETER_NAMES,
    PRIOR,
    Problem,
    applicable,
    kernel_properties,
    prior_and_bounds,
    solution_of,
)

# A trust-region fit whose data push a parameter against its bound stops short of it, the prior pulling back:
# TensorRT-LLM's per-layer cost ended 0.3% under its 100 us bound with a 9% standard error. Within 1% of a bound
# counts as on it.
BOUND_TOLERANCE = 0.01


# The least derivative of a row's log error in a parameter's log that counts as the row depending on it: a
# parameter that moves no prediction by a millionth of its own relative change is set by its prior alone.
IDENTIFIED_SENSITIVITY = 1e-6


def at_bound(log_theta, lower, upper) -> np.ndarray:
    """Whether each parameter lies within :data:`BOUND_TOLERANCE` (relative) of its lower or upper bound.

    >>> at_bound(np.log([0.9971e-4, 0.5, 0.0502]), np.array([1e-7, 0.05, 0.05]), np.array([1e-4, 0.95, 0.95]))
    array([ True, False,  True])
    """
    return (np.abs(log_theta - np.log(lower)) < BOUND_TOLERANCE) | (np.abs(log_theta - np.log(upper)) < BOUND_TOLERANCE)


def fit_record(problem: Problem, name: str) -> dict:
    """Each fitted parameter's value, bounds, standard error and whether it ended on a bound.

    Standard errors come from the Jacobian of the log residuals at the optimum (Gauss-Newton
    covariance s² (JᵀJ)⁻¹ in log θ, s² from the data residuals), converted to θ's units.
    """
    solution = solution_of(problem, name)
    if solution is None:
        return {"rows": 0, "parameters": {}}
    result, log_theta, free, n = solution.result, solution.log_theta, solution.free, solution.rows
    data = result.fun[:n]
    dof = max(n - int(free.sum()), 1)
    _, lower, upper = prior_and_bounds(name)
    jac = np.zeros((len(result.fun), len(free)))
    jac[:, free] = result.jac
    try:
        cov = np.linalg.pinv(jac.T @ jac) * float(data @ data) / dof
        log_se = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        log_se = np.full(len(PRIOR), np.nan)
    theta = np.exp(log_theta)
    # A parameter no row depends on (expert kernels for an engine without MoE rows, compute on a group it has
    # no rows on) is set by the prior and the pull between groups alone: it has no standard error, and its
    # sitting on a bound says nothing; nor has an inherited one. Rounding in the estimate leaves derivatives of
    # 1e-13 where there is no dependence (a product divided and multiplied again by another group's factor).
    identified = free & np.any(np.abs(jac[:n]) > IDENTIFIED_SENSITIVITY, axis=0)
    applies = applicable(kernel_properties(name))
    on_bound = identified & at_bound(log_theta, lower, upper)
    # four significant digits, kept inside the box (a value on a bound must not round past it)
    value = np.clip([float(f"{x:.4g}") for x in theta], lower, upper)
    return {"rows": n, "parameters": {
        key: {"value": float(value[i]), "lower": float(lower[i]), "upper": float(upper[i]),
              "stderr": float(f"{theta[i] * log_se[i]:.3g}") if identified[i] else None,
              "on_bound": bool(on_bound[i]),
              **({"inherited": True} if not free[i] else {} if identified[i] else {"identified": False})}
        for i, key in enumerate(PARAMETER_NAMES) if applies[i]}}
