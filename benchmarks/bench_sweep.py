"""Configurations evaluated per second by `estimator.sweep` (target: 1,000,000/s on 2 cores).

Run: python benchmarks/bench_sweep.py [--configs N] [--repeat R]
The sweep is the cartesian product of real database entries, so the figure
includes name resolution, spec-to-column conversion and flattening the results.
"""

from __future__ import annotations

import argparse
import time

from estimator.evaluation.api import sweep
from estimator.specs.database import load_database


def build_axes(target: int, db):
    models = sorted(m.name for m in db.models if not m.unmodelled_mechanisms)[:20]   # refused ones cannot be swept
    gpus = sorted(h.name for h in db.hardware)[:25]
    formats = ["bf16", "fp8", "int4-awq", "Q4_K_M"]
    kv = ["f16", "fp8"]
    n_gpus = [1]
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    prompts = [128, 512, 2048, 8192, 32768]
    per_output = len(models) * len(gpus) * len(formats) * len(kv) * len(batches) * len(prompts)
    outputs = [64 * (i + 1) for i in range(max(1, round(target / per_output)))]
    return models, gpus, formats, kv, batches, prompts, outputs, n_gpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=1_000_000, help="approximate sweep size")
    parser.add_argument("--repeat", type=int, default=5, help="timed repetitions (median reported)")
    parser.add_argument("--detail", action="store_true", help="also return the FLOP/byte ledgers (~60 columns)")
    args = parser.parse_args()
    db = load_database()
    models, gpus, formats, kv, batches, prompts, outputs, n_gpus = build_axes(args.configs, db)
    sweep(models, gpus, formats, kv, batches, prompts, outputs[:1], n_gpus, db=db)  # warm-up
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        table = sweep(models, gpus, formats, kv, batches, prompts, outputs, n_gpus, detail=args.detail, db=db)
        times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    print(f"{len(table):,} configurations, {len(table.columns)} result columns, in {median:.3f} s (median of {args.repeat}; "
          f"min {times[0]:.3f} s): {len(table) / median:,.0f} configurations/s")


if __name__ == "__main__":
    main()
