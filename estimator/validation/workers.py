"""Independent pieces of a validation (cross-validation folds, engine fits, interval bands) run in worker processes.

Each piece is the same computation whichever process runs it, so results do not depend on the number of
workers (tests/test_validation.py checks it); on 2 cores the published validation takes 86 s instead of 132 s.
"""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Callable, Sequence, TypeVar

Item = TypeVar("Item")
Shared = TypeVar("Shared")

_SHARED = None   # a worker's copy of the shared input, set once when the worker starts


def map_in_workers(function: Callable[[Shared, Item], object], shared: Shared, items: Sequence[Item],
                   jobs: int | None = None, progress: Callable[[int, int], None] | None = None) -> list:
    """``[function(shared, item) for item in items]``, over ``jobs`` worker processes (None: one per core;
    1: none). ``function`` must be a module-level function (a spawned worker imports it by name);
    ``progress(done, total)`` is called as each item finishes."""
    report = progress or (lambda done, total: None)
    workers = min(jobs or available_cores(), len(items))
    if workers <= 1:
        results = []
        for item in items:
            results.append(function(shared, item))
            report(len(results), len(items))
        return results
    with ProcessPoolExecutor(workers, mp_context=_context(), initializer=_keep, initargs=(shared,)) as pool:
        futures = [pool.submit(_call, function, item) for item in items]
        for done, _ in enumerate(as_completed(futures), start=1):
            report(done, len(items))
        return [future.result() for future in futures]


def available_cores() -> int:
    """The cores this process may run on (its affinity where the platform has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _context():
    """The platform's own way of starting workers: fork on Linux up to Python 3.13 (the workers share the
    parent's input without a copy), forkserver from 3.14, spawn on macOS and Windows (each worker receives the
    input once, pickled)."""
    return multiprocessing.get_context()


def _keep(shared) -> None:
    global _SHARED
    _SHARED = shared


def _call(function, item):
    return function(_SHARED, item)
