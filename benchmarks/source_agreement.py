"""How far independent sources disagree on the same configuration: a floor under leave-one-source-out error.

    python benchmarks/source_agreement.py            # per phase, then the pairs that disagree most
    python benchmarks/source_agreement.py --list 30

Rows from different sources that state the same configuration (model, device, devices and tensor parallelism,
weight and KV formats, engine and backend, attention path, batch or load, prompt, output and context lengths,
metric and statistic) measure the same quantity. Where two sources give a and b for it, |a/b - 1| is how far
one is off the other: no model of the configuration alone can predict both closer than that, so half the
median disagreement is about the least held-out median error the data allow on those rows. Each source
contributes its median value per configuration; each pair of sources on one configuration is one comparison.
Reads the dataset only (no fit), in a few seconds.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from itertools import combinations

import numpy as np

from estimator.evaluation.intervals import PHASE_OF_REGIME, measurement_regime
from estimator.formatting import table
from estimator.specs.database import load_database
from estimator.validation.dataset import load_dataset
from estimator.validation.fitting import build_problem

# measurement columns a row's configuration is stated in, beyond what the resolved specs carry
STATED = ("attention", "statistic", "concurrency", "request_rate", "context_depth", "gpu_layers", "cpu_moe",
          "n_ubatch")


def configuration_key(row: dict, config, engine: str) -> tuple:
    """What a measurement is of: the resolved specs (so aliases meet) and the stated settings."""
    return (config.model.name, config.hardware.name, config.layout.label, config.weight_format.name,
            config.kv_format.name, engine, config.batch, config.prompt_tokens, config.output_tokens,
            row["metric"], *(str(row.get(k) or "") for k in STATED))


def comparisons(problem) -> list[dict]:
    """One entry per pair of sources measuring one configuration: both values and the phase."""
    r = problem.resolved
    by_key = defaultdict(lambda: defaultdict(list))
    phase = {}
    for i, (row, config) in enumerate(zip(problem.rows, r.configs)):
        key = configuration_key(row, config, str(problem.engines[i]))
        by_key[key][str(problem.sources[i])].append(float(problem.measured[i]))
        regime = measurement_regime(r.metrics[i], config.batch, r.saturate[i], r.serving[i].under_load)
        phase[key] = PHASE_OF_REGIME[regime]
    out = []
    for key, sources in by_key.items():
        for (sa, va), (sb, vb) in combinations(sorted(sources.items()), 2):
            a, b = float(np.median(va)), float(np.median(vb))
            out.append({"key": key, "phase": phase[key], "sources": (sa, sb), "values": (a, b),
                        "disagreement": max(a, b) / min(a, b) - 1})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", type=int, default=15, help="the pairs that disagree most (default 15)")
    args = parser.parse_args()
    pairs = comparisons(build_problem(load_dataset(), load_database()))
    rows = []
    for phase in sorted({p["phase"] for p in pairs}):
        d = np.array([p["disagreement"] for p in pairs if p["phase"] == phase])
        configs = len({p["key"] for p in pairs if p["phase"] == phase})
        rows.append((phase, configs, len(d), f"{np.median(d):.1%}", f"{np.quantile(d, 0.9):.1%}",
                     f"{np.median(d) / 2:.1%}"))
    print("Sources measuring the same configuration: max/min - 1 per pair of sources")
    print(table(rows, header=("phase", "configurations", "pairs", "median", "P90", "floor (median / 2)")))
    worst = sorted(pairs, key=lambda p: -p["disagreement"])[:args.list]
    print("\nPairs that disagree most")
    print(table([(p["key"][0], p["key"][1], p["key"][5], p["key"][9], f"{p['values'][0]:.4g}", f"{p['values'][1]:.4g}",
                  " / ".join(p["sources"])) for p in worst],
                header=("model", "device", "engine", "metric", "first", "second", "sources")))


if __name__ == "__main__":
    main()
