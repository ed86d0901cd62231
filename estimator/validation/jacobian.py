"""A fit's Jacobian by forward differences, moving together the parameters that no row depends on two of.

One evaluation of the estimate over an engine's rows costs milliseconds, and a least-squares fit takes the
Jacobian of its residuals some twenty times: one evaluation per parameter is most of a cross-validation's time.
The per-group parameters touch disjoint rows (a row reads the bandwidth factors of its memory's group and the
compute factor of its market's), so one evaluation that moves, say, the three groups' compute factors at once
gives three columns, each read off its own rows: column grouping for sparse Jacobians (docs/formulas.md §9,
"Fitting"). The steps are those of scipy's ``2-point`` scheme, so the Jacobian is the one scipy would take.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def forward_steps(x: np.ndarray, lower: np.ndarray, upper: np.ndarray, relative_step: float) -> np.ndarray:
    """scipy's ``2-point`` steps for a given relative step: ``relative_step · x`` (or, where that is lost to rounding,
    √ε · max(1, |x|)), away from zero and turned back where a step would leave the box, as the difference that is
    representable in floating point.

    >>> np.round(forward_steps(np.array([0.5, -2.0, 0.999]), np.full(3, -5.0), np.ones(3), 1e-2), 6)
    array([ 0.005  , -0.02   , -0.00999])
    """
    sign = np.where(x >= 0, 1.0, -1.0)
    step = relative_step * sign * np.abs(x)
    step = np.where((x + step) - x == 0, np.sqrt(np.finfo(float).eps) * sign * np.maximum(1.0, np.abs(x)), step)
    step = np.where((x + step > upper) | (x + step < lower), -step, step)
    return (x + step) - x


def column_groups(depends: np.ndarray) -> list[list[int]]:
    """The columns of a Jacobian whose rows ``depends`` (rows x columns) marks, grouped so that no row depends on
    two columns of a group: each column joins the first group it does not clash with, the densest columns first, as
    they clash most (the greedy grouping of docs/formulas.md §9, "Fitting").

    >>> column_groups(np.array([[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 1, 1]], dtype=bool))
    [[2], [0, 1, 3]]
    """
    groups, rows_of = [], []
    for j in sorted(range(depends.shape[1]), key=lambda j: -int(depends[:, j].sum())):
        for group, rows in zip(groups, rows_of):
            if not np.any(rows & depends[:, j]):
                group.append(j)
                rows |= depends[:, j]
                break
        else:
            groups.append([j])
            rows_of.append(depends[:, j].copy())
    return [sorted(g) for g in groups]


def grouped_jacobian(rows_residuals: Callable[[np.ndarray], np.ndarray], x: np.ndarray, f0: np.ndarray,
                     steps: np.ndarray, depends: np.ndarray, groups: list[list[int]]) -> np.ndarray:
    """Forward-difference Jacobian of ``rows_residuals`` (one value per row) at ``x``, where it takes the values
    ``f0``, with ``steps``; ``depends[i, j]`` says whether row i may depend on parameter j at all, and ``groups`` are
    its :func:`column_groups`. One evaluation per group; each column is read off the rows that may depend on it
    (zero elsewhere)."""
    jac = np.zeros((len(f0), len(x)))
    for group in groups:
        moved = x.copy()
        moved[group] += steps[group]
        change = rows_residuals(moved) - f0
        for j in group:
            jac[depends[:, j], j] = change[depends[:, j]] / steps[j]
    return jac
