"""Wall time of the estimates that solve a serving steady state (targets on 2 cores: one estimate under a load
under 0.5 s; `roofline speculation` under a load, 54 draft lengths x acceptance rates, under 2 s).

Run: python benchmarks/bench_serving.py [--repeat R]
An estimate under a load iterates the continuous-batching steady state 40 times, each a decode step at a
trial batch (estimator.serving.continuous_batching); the speculation grid solves all its cells in one
vectorized sweep (the serving axis of estimator.evaluation.api.sweep).
"""

from __future__ import annotations

import argparse
import statistics
import time

from estimator import estimate, speculative_speedup_grid
from estimator.cli import SPECULATION_ALPHAS, SPECULATION_GAMMAS
from estimator.specs.database import load_database

CASES = {
    "estimate, 64 clients, vLLM": lambda db: estimate("llama-3.1-8b", "h100", concurrency=64, prompt_tokens=2048,
                                                       output_tokens=256, engine="vLLM", db=db),
    "estimate, 4 requests/s, chat lengths": lambda db: estimate("llama-3.1-70b", "h200", n_gpus=2, rate=4.0,
                                                                 lengths="chat", weight_format="fp8", db=db),
    "speculation grid, 16 clients": lambda db: speculative_speedup_grid(
        "llama-3.1-70b", "h100", SPECULATION_ALPHAS, SPECULATION_GAMMAS, n_gpus=2, draft_cost=0.05,
        concurrency=16, db=db),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (median reported)")
    args = parser.parse_args()
    db = load_database()
    for name, run in CASES.items():
        run(db)   # warm: the first call imports and builds the columns' caches
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            run(db)
            times.append(time.perf_counter() - start)
        print(f"{name}: median {statistics.median(times):.3f} s over {args.repeat} runs "
              f"(min {min(times):.3f} s, max {max(times):.3f} s)")


if __name__ == "__main__":
    main()
