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


def plot_predicted_vs_measured(ax, measured, predicted, groups=None, band: float = 0.20, title: str = ""):
    """Log-log scatter of predicted against measured, the diagonal and a ±band shading."""
    measured, predicted = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    groups = np.asarray(groups) if groups is not None else np.array(["rows"] * len(measured))
    artists = [ax.scatter(measured[groups == g], predicted[groups == g], s=10, alpha=0.7, label=str(g))
               for g in sorted(set(groups))]
    lo, hi = min(measured.min(), predicted.min()) / 1.5, max(measured.max(), predicted.max()) * 1.5
    line = np.geomspace(lo, hi, 50)
    artists.append(ax.plot(line, line, color="black", linewidth=0.8)[0])
    artists.append(ax.fill_between(line, line * (1 - band), line * (1 + band), color="grey", alpha=0.2,
                                   label=f"±{band:.0%}"))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (metric's unit)")
    ax.set_ylabel("predicted, cross-validated")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return artists
