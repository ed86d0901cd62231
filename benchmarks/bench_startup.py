"""Wall time of the README's first command, `roofline estimate` in a fresh process (target: under 2 s on 2 cores).

Run: python benchmarks/bench_startup.py [--repeat R]
Most of it is start-up: importing numpy, pydantic and the package, and reading the 230 database files
(libyaml parses them in about 0.6 s where the pure-Python parser takes 4.6 s, estimator.errors.load_yaml).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMAND = [sys.executable, "-m", "estimator.cli", "estimate", "--model", "llama-3.1-70b", "--gpu", "h200",
           "--format", "fp8", "--batch", "16", "--prompt", "2048", "--output", "512"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (median reported)")
    args = parser.parse_args()
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        subprocess.run(COMMAND, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    print(f"roofline estimate: median {statistics.median(times):.2f} s over {args.repeat} runs "
          f"(min {min(times):.2f} s, max {max(times):.2f} s)")


if __name__ == "__main__":
    main()
