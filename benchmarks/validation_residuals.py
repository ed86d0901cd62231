"""Held-out residuals of `roofline validate --published`, grouped: where a mechanism is missing.

    python benchmarks/validation_residuals.py                       # engine x regime x backend x device group
    python benchmarks/validation_residuals.py engine "format family" # any labels, or measurement columns
    python benchmarks/validation_residuals.py --rows engine=vLLM regime=throughput   # the rows of one cell
    python benchmarks/validation_residuals.py engine backend "version series"        # by engine release era

For each group: rows, the median of predicted / measured speed (above 1: predicted too fast) and the median
absolute log error. It runs the whole leave-one-source-out validation (about 90 s on 2 cores), so it is
an offline analysis, not a test.
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict

import numpy as np

from estimator.formatting import table
from estimator.validation.published import run


def version_series(version: str) -> str:
    """The release series of an engine version, to look for eras: llama.cpp's build number by thousands
    ("b2824" -> "b2xxx"), a dotted release by major.minor ("0.7.3.dev138" -> "0.7"); "unstated" if none."""
    version = version.strip()
    if build := re.fullmatch(r"b(\d+)", version):
        return f"b{int(build.group(1)) // 1000}xxx"
    if release := re.match(r"v?(\d+)\.(\d+)", version):
        return f"{release.group(1)}.{release.group(2)}"
    return "unstated"


def _value(v, labels, key: str, i: int) -> str:
    """A validation label (engine, regime, backend, device group, format family ...), "version series", or a
    measurement column."""
    if key == "version series":
        return version_series(str(v.problem.rows[i].get("engine_version") or ""))
    return str(labels[key][i]) if key in labels else str(v.problem.rows[i].get(key, ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("keys", nargs="*", default=["engine", "regime", "backend", "device group"])
    parser.add_argument("--rows", nargs="*", metavar="KEY=VALUE", help="list the rows of one group instead")
    parser.add_argument("--min-rows", type=int, default=5)
    args = parser.parse_args()

    v = run()
    labels = v.labels()
    # predicted / measured speed: time metrics inverted, so above 1 always means "predicted too fast"
    log_speed = -np.log(v.speed_ratio)
    if args.rows:
        wanted = dict(item.split("=", 1) for item in args.rows)
        rows = [(v.problem.rows[i]["id"], v.problem.rows[i]["hardware"], v.problem.resolved.configs[i].model.name,
                 v.problem.rows[i]["metric"], f"{v.problem.measured[i]:.4g}", f"{v.predicted[i]:.4g}")
                for i in range(len(v.predicted)) if all(_value(v, labels, k, i) == x for k, x in wanted.items())]
        print(table(rows, header=("id", "hardware", "model", "metric", "measured", "predicted")))
        return
    groups: dict[tuple, list[float]] = defaultdict(list)
    for i, value in enumerate(log_speed):
        if np.isfinite(value):
            groups[tuple(_value(v, labels, k, i) for k in args.keys)].append(float(value))
    rows = [(*key, len(values), f"{np.exp(np.median(values)):.2f}", f"{np.median(np.abs(values)):.2f}")
            for key, values in sorted(groups.items(), key=lambda kv: -len(kv[1])) if len(values) >= args.min_rows]
    print(table(rows, header=(*args.keys, "rows", "predicted/measured", "median |log error|")))


if __name__ == "__main__":
    main()
