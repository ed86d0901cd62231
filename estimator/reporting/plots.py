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
    :func:`estimator.evaluation.api.speculative_speedup_grid`.
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
    _log_log(ax, "measured (metric's unit)", "predicted, cross-validated", title)
    return artists


def plot_roofline(ax, devices: list[tuple[str, float, float]], points: list[tuple[str, float, float]],
                  title: str = ""):
    """Roofs of devices (name, peak FLOP/s, bandwidth B/s) and operating points (label, FLOP/byte, FLOP/s)."""
    x = np.geomspace(0.1, 1e4, 200)
    artists = []
    for name, peak, bandwidth in devices:
        artists.append(ax.plot(x, np.minimum(peak, x * bandwidth), label=name)[0])
    for i, (label, intensity, achieved) in enumerate(points):
        artists.append(ax.scatter([intensity], [achieved], marker="o" if "decode" in label else "^", zorder=3))
        artists.append(ax.annotate(label, (intensity, achieved), fontsize=7, xytext=(6, 10 - 12 * (i % 3)),
                                   textcoords="offset points"))
    _log_log(ax, "arithmetic intensity (FLOP/byte)", "attainable FLOP/s", title)
    return artists


def plot_lines(ax, x, series: dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str = "",
               logx: bool = False, logy: bool = False):
    """One line per named series against a shared x."""
    artists = [ax.plot(x, y, marker="o", markersize=3, label=name)[0] for name, y in series.items()]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return artists


def plot_percentiles(ax, x, series: dict[str, Sequence[float]], xlabel: str, ylabel: str, target: float | None = None,
                     planned: float | None = None, title: str = "", logx: bool = False):
    """Latency percentiles against load, one line per percentile (p50 solid, p90 dashed, p99 dotted).

    ``series`` maps a label ending in the percentile ("TTFT p99") to one value per ``x``; the caller
    leaves saturated loads out. ``target`` draws the latency target, ``planned`` the planned load.
    """
    styles = {"p50": "-", "p90": "--", "p99": ":"}
    artists = [ax.plot(x, y, marker="o", markersize=3, linestyle=styles.get(name.split()[-1], "-"), label=name)[0]
               for name, y in series.items()]
    if target is not None:
        artists.append(ax.axhline(target, color="tab:red", linewidth=0.9, linestyle="--", label="target"))
    if planned is not None:
        artists.append(ax.axvline(planned, color="grey", linewidth=0.8, linestyle=":", label="planned load"))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.legend(fontsize="small")
    return artists


def plot_memory_breakdown(ax, labels: list[str], parts: dict[str, Sequence[float]], capacity: Sequence[float],
                          title: str = ""):
    """Stacked bars of memory per device (GB), with each device's usable capacity marked."""
    bottom = np.zeros(len(labels))
    artists = []
    for name, values in parts.items():
        values = np.asarray(values, dtype=float) / 1e9
        artists.append(ax.bar(labels, values, bottom=bottom, label=name))
        bottom += values
    artists.append(ax.scatter(labels, np.asarray(capacity) / 1e9, marker="_", s=400, color="black",
                              label="available", zorder=3))
    ax.set_ylabel("GB per device")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize="small")
    return artists


def plot_costs(ax, labels: list[str], costs: Sequence[float], title: str = ""):
    """Cost per million output tokens, one bar per configuration."""
    bars = ax.bar(labels, costs, color="tab:green")
    ax.set_ylabel("USD per million output tokens")
    ax.set_title(title)
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    return [bars]


def _log_log(ax, xlabel: str, ylabel: str, title: str) -> None:
    """Both axes logarithmic, labelled, titled, with a small legend."""
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize="small")
