"""How far each fitted engine parameter moves when the sources are resampled: a bootstrap over sources.

    python benchmarks/source_bootstrap.py                  # 30 replicates, seed 0, the table
    python benchmarks/source_bootstrap.py --replicates 100 --json benchmarks/results/source_bootstrap.json

The fit record's standard errors (estimator/validation/fit_record.py) come from the Jacobian at
the optimum and treat rows as independent; the rows of one source share its machine, build and method, so
the unit to resample is the source (docs/formulas.md §9, "A bootstrap over sources"). Each replicate draws as
many sources as the dataset has, with replacement, refits every engine on the rows of the sources drawn (a
source drawn twice counts twice) and keeps each parameter's product as the fit record states it. Reported per engine and
parameter the data identify: the fit on all rows, the replicates' median and 10th to 90th percentiles, and
the share of replicates in which it ended on a bound (``at_bound``). A replicate that draws none of an
engine's sources does not refit it, and one whose rows do not move a parameter leaves it at its prior: neither
counts as an estimate of it. About 8 s a replicate on 2 cores.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from estimator.formatting import table
from estimator.specs.database import load_database
from estimator.validation.dataset import load_dataset
from estimator.validation.fit_record import fit_record
from estimator.validation.fitting import build_problem, fit_all


def records(problem) -> dict[str, dict]:
    """Every engine's fit record on ``problem``'s rows, by engine."""
    return {name: fit_record(problem, name)["parameters"] for name in fit_all(problem)}


def rows_by_source(problem) -> list[list[int]]:
    """Each source's row indices, in the order of the sources' names."""
    by_source = defaultdict(list)
    for i, source in enumerate(problem.sources):
        by_source[str(source)].append(i)
    return [by_source[name] for name in sorted(by_source)]


def replicate(problem, sources: list[list[int]], rng) -> dict[str, dict]:
    """The fit records of one resampling of the sources (``rows_by_source``)."""
    drawn = rng.choice(len(sources), size=len(sources), replace=True)
    return records(problem.subset(np.concatenate([sources[k] for k in drawn])))


def summary(full: dict, replicates: list[dict]) -> list[dict]:
    """Per engine and identified parameter: the fit on all rows and the spread over the replicates."""
    out = []
    for name, parameters in sorted(full.items()):
        for key, record in parameters.items():
            if record.get("identified") is False or record.get("inherited"):
                continue
            # a replicate whose sources do not move the parameter left it at the prior: no estimate either
            drawn = [r[name][key] for r in replicates if name in r and r[name][key].get("identified") is not False]
            if not drawn:
                continue
            values = np.array([d["value"] for d in drawn])
            out.append({"engine": name, "parameter": key, "all_rows": record["value"],
                        "lower": record["lower"], "upper": record["upper"], "replicates": len(drawn),
                        "median": float(np.median(values)), "p10": float(np.percentile(values, 10)),
                        "p90": float(np.percentile(values, 90)),
                        "on_bound_share": float(np.mean([d["on_bound"] for d in drawn]))})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the summary to this file")
    args = parser.parse_args()
    problem = build_problem(load_dataset(), load_database())
    full = records(problem)
    rng = np.random.default_rng(args.seed)
    sources = rows_by_source(problem)
    replicates = []
    for k in range(args.replicates):
        replicates.append(replicate(problem, sources, rng))
        print(f"replicate {k + 1} of {args.replicates}", end="\r", flush=True)
    rows = summary(full, replicates)
    print(table([(r["engine"], r["parameter"], f"{r['all_rows']:.4g}", f"{r['median']:.4g}",
                  f"{r['p10']:.3g} - {r['p90']:.3g}", f"{r['on_bound_share']:.0%} of {r['replicates']}")
                 for r in rows], header=["engine", "parameter", "all rows", "median", "10th-90th", "on a bound"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"replicates": args.replicates, "seed": args.seed, "sources": len(sources),
                       "parameters": rows}, out, indent=1)


if __name__ == "__main__":
    main()
