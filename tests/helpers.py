"""Build evaluation inputs with chosen efficiencies, so formulas can be checked by hand."""

from __future__ import annotations

import shlex

import numpy as np

from estimator.efficiency.defaults import EngineDefaults
from estimator.evaluation.columns import (
    compute_peak_table,
    format_columns,
    fp4_gemm_table,
    hardware_columns,
    kv_columns,
    model_columns,
)
from estimator.evaluation.compute import compute_results
from estimator.specs.formats import kv_format, weight_format

IDEAL_ENGINE = EngineDefaults(
    bandwidth_eff={"native": 1.0, "weight_only": 1.0, "gguf": 1.0, "fp4": 1.0}, kv_bandwidth_eff=1.0,
    compute_eff=1.0, per_step_s=0.0, per_layer_s=0.0, allreduce_latency_s=0.0, basis="test: datasheet peaks, no overheads")


def run(spec, hw, fmt="f16", kv="f16", B=1, T=512, O=256, n_gpus=1, ideal=True, fused=True,
        tp=None, pp=1, ep=1, dp=1, serving=None, engine=None, **overrides):
    """Evaluate one configuration; ``ideal`` sets every efficiency to 1 and overheads to 0; ``engine``
    (with ``ideal=False``) evaluates with those engine parameters instead of the generic ones."""
    f = weight_format(fmt)
    hw_cols = hardware_columns([hw])
    if ideal:
        hw_cols["device_bandwidth_eff"] = np.ones(1)
        hw_cols["device_compute_eff"] = np.ones(1)
        hw_cols["collective_eff"] = np.ones(1)
    chosen = IDEAL_ENGINE if ideal else (engine or _generic())
    m_cols, f_cols = model_columns([spec]), format_columns([f], chosen)
    for key, value in overrides.items():
        for cols in (m_cols, hw_cols, f_cols):
            if key in cols:
                cols[key] = np.asarray([value], dtype=float)
    peaks, dtypes = compute_peak_table([f], [hw])
    hw_cols["fp4_gemm"] = fp4_gemm_table(dtypes)[0]
    kwargs = {"engine": chosen}
    layout = {"tp": tp or n_gpus, "pp": pp, "ep": ep, "dp": dp}
    out = compute_results(m_cols, hw_cols, f_cols, kv_columns([kv_format(kv)]), peaks[0], B, T, O, layout,
                   serving={"fused_attention": fused, **(serving or {})}, **kwargs)
    return {k: float(np.asarray(v).reshape(-1)[0]) for k, v in out.items()}


def _generic():
    from estimator.efficiency.defaults import GENERIC_ENGINE
    return GENERIC_ENGINE


def cli(capsys, *argv):
    """Run ``roofline`` in-process: (exit code, stdout, stderr)."""
    from estimator.cli import main

    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def median_abs_error(rows: list[dict], db) -> float:
    """Median |error| of measured rows predicted with the shipped profiles; every row must resolve."""
    import statistics

    from estimator.validation.predict import predict_rows
    results = predict_rows(rows, db)
    assert all(r["status"] == "ok" for r in results), [r["reason"] for r in results if r["status"] != "ok"]
    return statistics.median(abs(float(r["rel_error"])) for r in results)


def command_flags(command: str) -> dict:
    """The flags of a command line and the value after each (True for a switch)."""
    words, flags = shlex.split(command), {}
    for i, word in enumerate(words):
        if word.startswith("-"):
            nxt = words[i + 1] if i + 1 < len(words) else None
            flags[word] = True if nxt is None or nxt.startswith("-") else nxt
    return flags
