"""Timing kernels honestly: warm up, synchronise, repeat, report the median and the spread.

On CUDA each repetition is timed with a pair of CUDA events (device-side time);
on CPU and MPS the device is synchronised before reading the host clock.
Callers rotate their inputs so repetitions do not find the data in cache
(docs/conventions.md, microbenchmarks; triton ``do_bench``, ``torch.utils.benchmark``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Timing:
    """Seconds per call over ``reps`` timed repetitions."""

    median_s: float
    p10_s: float
    p90_s: float
    reps: int

    def as_dict(self) -> dict:
        return {"median_s": self.median_s, "p10_s": self.p10_s, "p90_s": self.p90_s, "reps": self.reps}


def synchronize(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    elif device == "mps":
        torch.mps.synchronize()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(torch, device: str, fn: Callable[[int], object], *, warmup: int = 3, reps: int = 10,
            min_time_s: float = 0.0, inner: int = 1) -> Timing:
    """Time ``fn(i)`` (i = call index, for rotating inputs); ``inner`` calls per timed sample.

    The index runs on from the warm-up calls, so a timed call never reuses the inputs a warm-up call has
    just left in the cache: restarting at 0 made three of five samples of a small rotated matrix cache hits."""
    for i in range(warmup):
        fn(i)
    synchronize(torch, device)
    samples = []
    started = time.perf_counter()
    i = 0
    while i < reps or time.perf_counter() - started < min_time_s:
        if device == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for j in range(inner):
                fn(warmup + i * inner + j)
            stop.record()
            stop.synchronize()
            samples.append(start.elapsed_time(stop) / 1e3 / inner)
        else:
            synchronize(torch, device)
            t0 = time.perf_counter()
            for j in range(inner):
                fn(warmup + i * inner + j)
            synchronize(torch, device)
            samples.append((time.perf_counter() - t0) / inner)
        i += 1
        if i >= 10 * reps:
            break
    return Timing(statistics.median(samples), _quantile(samples, 0.1), _quantile(samples, 0.9), len(samples))
