"""Wall time of `roofline validate --published --json`, computed and then loaded from its kept result (target: the
kept result under 3 s on 2 cores, start-up included; the computation takes minutes).

Run: python benchmarks/bench_validate.py [--repeat R]
Both runs use a fresh folder for kept results ($ROOFLINE_CACHE_DIR), so the user's own is neither read nor
written. The first run computes the cross-validation and keeps it (estimator/validation/result_cache.py); the
next ones hash the dataset, databases and packages and load it, and must print the same JSON.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMAND = [sys.executable, "-m", "estimator.cli", "validate", "--published", "--json"]


def timed(env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(COMMAND, check=True, capture_output=True, text=True, env=env)
    return time.perf_counter() - start, done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs that load the kept result (median reported)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="roofline-bench-cache-") as folder:
        env = {**os.environ, "ROOFLINE_CACHE_DIR": folder}
        computed_s, computed = timed(env)
        loads = [timed(env) for _ in range(args.repeat)]
    if any(out != computed for _, out in loads):
        sys.exit("the kept result printed other figures than the computed one")
    times = [t for t, _ in loads]
    print(f"roofline validate --published: computed in {computed_s:.1f} s; kept result loaded in median "
          f"{statistics.median(times):.2f} s over {args.repeat} runs (min {min(times):.2f} s, max {max(times):.2f} s)")


if __name__ == "__main__":
    main()
