"""Plots: functions take a matplotlib ``ax``, draw, and return the artists; they never show or save.

matplotlib is imported by the caller (it is a core dependency, but the analytic
modules never import it).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def plot_speculative_speedup(ax, alphas: Sequence[float], gammas: Sequence[int], speedups: np.ndarray,
                             title: str = ""):
    """Speed-up against acceptance rate α, one line per draft length γ.

    ``speedups`` has shape (len(gammas), len(alphas)), e.g. from
    :func:`estimator.api.speculative_speedup_grid`.
    """
    lines = [ax.plot(alphas, row, marker="o", markersize=3, label=f"γ = {g}")[0] for g, row in zip(gammas, speedups)]
    lines.append(ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--"))
    ax.set_xlabel("acceptance rate α (per drafted token)")
    ax.set_ylabel("decode speed-up over no speculation")
    ax.set_title(title)
    ax.legend(title="draft tokens", fontsize="small")
    return lines
