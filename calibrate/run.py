"""Run a calibration: plan the measurements for the device, take them, fit and build the profile.

Sizes adapt to the memory the device has free; an out-of-memory error, an
unsupported data type or a failed correctness check is recorded and skipped;
Ctrl-C stops the run and keeps what was measured (the profile says it is
incomplete).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from calibrate import benchmarks as bm
from calibrate import require_torch
from calibrate.fit import fit_summary
from calibrate.identity import identify, software
from estimator.efficiency.calibration_profile import SCHEMA_VERSION, CalibrationProfile, now_iso
from estimator.errors import ConfigurationError
from estimator.specs.database import Database, load_database

MiB, GiB = 2**20, 2**30
DEVICES = ("cuda", "cpu", "mps")


@dataclass(frozen=True)
class Plan:
    """What to measure. Sizes are bytes; shapes are (N, K) of LLM weight matrices."""

    bandwidth_sizes: tuple[int, ...]
    matmul_shapes: tuple[tuple[int, int], ...]
    matmul_rows: tuple[int, ...]
    gemm_sizes: tuple[int, ...]
    dtypes: tuple[str, ...]
    attention_seqs: tuple[int, ...]
    host_bytes: int
    reps: int
    kv_expand_bytes: int   # the grouped KV cache a head expansion copies (compact size)
    # models whose own decode matrices are timed too: (name, ((N, K, count), ...)), calibrate.decoder.decode_matrices
    model_matrices: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...] = ()


def plan_for(device: str, mode: str) -> Plan:
    """The quick (well under a minute) or full (a few minutes) plan for a device kind."""
    gpu = device != "cpu"
    quick = mode == "quick"
    top = (1 * GiB if quick else 4 * GiB) if gpu else (256 * MiB if quick else 1 * GiB)
    sizes = tuple(s for s in (2**p * MiB for p in range(0, 13, 2 if quick else 1)) if s <= top)
    shapes = ((4096, 4096), (14336, 4096)) if quick else ((4096, 4096), (14336, 4096), (28672, 8192))
    if not gpu:
        shapes = shapes[:1] if quick else shapes[:2]
    return Plan(
        bandwidth_sizes=sizes,
        matmul_shapes=shapes,
        matmul_rows=(1, 4, 16, 64, 256) if quick else (1, 2, 4, 8, 16, 32, 64, 128, 256),
        gemm_sizes=((2048, 8192) if quick else (2048, 4096, 8192, 16384)) if gpu else
        ((256, 1024) if quick else (256, 1024, 2048)),
        dtypes=("fp16", "bf16", "fp8", "int8") if device == "cuda" else ("fp32", "bf16") if device == "cpu"
        else ("fp32", "fp16"),
        attention_seqs=((1024, 4096) if quick else (1024, 4096, 16384)) if gpu else ((256, 1024) if quick else
                                                                                   (256, 1024, 2048)),
        host_bytes=256 * MiB if quick else 1 * GiB,
        reps=10 if quick else 20,
        kv_expand_bytes=(64 * MiB if quick else 256 * MiB) if gpu else (16 * MiB if quick else 64 * MiB),
    )


def _budget_bytes(torch, device: str) -> float:
    """Memory the benchmarks may use: half the device's free memory (a quarter of the host's)."""
    if device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        return free / 2
    try:
        with open("/proc/meminfo") as fh:
            available = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable"))
        return available / 4
    except (OSError, StopIteration):
        return 2 * GiB


def _llc_bytes(torch, device: str) -> float:
    if device == "cuda":
        return float(getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * MiB))
    try:
        with open("/sys/devices/system/cpu/cpu0/cache/index3/size") as fh:
            text = fh.read().strip()
        return float(text[:-1]) * {"K": 1024, "M": MiB}.get(text[-1], 1)
    except (OSError, ValueError):
        return 32 * MiB


def _tasks(torch, device: str, plan: Plan, llc: float, budget: float) -> list[tuple[str, dict, Callable]]:
    reps = plan.reps
    tasks = [("bandwidth", {"size_bytes": s}, lambda s=s: bm.bandwidth(
        torch, device, s, llc_bytes=llc, budget_bytes=budget, reps=reps)) for s in plan.bandwidth_sizes if 2 * s <= budget]
    for dtype in plan.dtypes:
        for n, k in plan.matmul_shapes:
            tasks += [("matmul", {"dtype": dtype, "m": m, "n": n, "k": k}, lambda d=dtype, m=m, n=n, k=k: bm.matmul(
                torch, device, d, m, n, k, llc_bytes=llc, budget_bytes=budget, reps=reps)) for m in plan.matmul_rows]
        for model, matrices in plan.model_matrices:
            tasks += [("model_matmul", {"model": model, "dtype": dtype, "m": m, "n": n, "k": k, "count": count},
                       lambda d=dtype, m=m, n=n, k=k: bm.matmul(torch, device, d, m, n, k, llc_bytes=llc,
                                                                 budget_bytes=budget, reps=reps))
                      for n, k, count in matrices for m in plan.matmul_rows]
        tasks += [("matmul", {"dtype": dtype, "m": s, "n": s, "k": s}, lambda d=dtype, s=s: bm.matmul(
            torch, device, d, s, s, s, llc_bytes=llc, budget_bytes=budget, reps=max(3, reps // 3)))
            for s in plan.gemm_sizes]
    attention_dtype = "fp32" if device == "cpu" else "bf16" if device == "cuda" else "fp16"
    tasks += [("attention", {"seq": s}, lambda s=s: bm.attention(torch, device, attention_dtype, s))
              for s in plan.attention_seqs]
    tasks.append(("kv_expand", {"size_bytes": plan.kv_expand_bytes}, lambda: bm.kv_expand(
        torch, device, attention_dtype, plan.kv_expand_bytes, llc_bytes=llc, budget_bytes=budget, reps=reps)))
    tasks += [("launch", {}, lambda: bm.launch_overhead(torch, device)),
              ("small_op_chain", {}, lambda: bm.small_op_chain(torch, device)),
              ("eager_host", {}, lambda: bm.eager_host(torch, device, attention_dtype, reps))]
    if device == "cuda":
        tasks.append(("sync", {}, lambda: bm.sync_overhead(torch, device)))
        tasks += [("host_transfer", {"pinned": p, "to_device": d}, lambda p=p, d=d: bm.host_transfer(
            torch, device, plan.host_bytes, pinned=p, to_device=d)) for p in (True, False) for d in (True, False)]
        tasks.append(("peer_transfer", {}, lambda: bm.peer_transfer(torch, plan.host_bytes)))
    return tasks


def check_device(torch, device: str) -> None:
    if device not in DEVICES:
        raise ConfigurationError(f"unknown device {device!r}; use one of: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigurationError("no CUDA device is visible to torch here; use --device cpu (or mps on a Mac)")
    if device == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigurationError("Apple MPS is not available here; use --device cpu")


def calibrate(device: str = "cpu", mode: str = "quick", plan: Plan | None = None, db: Database | None = None,
              progress: Callable[[str], None] | None = None) -> CalibrationProfile:
    """Measure ``device`` and return its profile (interrupted runs return what they measured)."""
    torch = require_torch()
    check_device(torch, device)
    db = db or load_database()
    plan = plan or plan_for(device, mode)
    identity = identify(torch, device, db)
    llc, budget = _llc_bytes(torch, device), _budget_bytes(torch, device)
    tasks = _tasks(torch, device, plan, llc, budget)
    measurements, complete = [], True
    for i, (bench, params, fn) in enumerate(tasks, 1):
        if progress:
            progress(f"[{i}/{len(tasks)}] {bench} {' '.join(f'{k}={v}' for k, v in params.items())}")
        try:
            measurements.append({"bench": bench, **params, **fn(), "ok": True})
        except KeyboardInterrupt:
            complete = False
            break
        except bm.Skipped as exc:
            measurements.append({"bench": bench, **params, "ok": False, "skipped": str(exc)})
            if progress:
                progress(f"{bench}: skipped ({exc})")
        except (RuntimeError, TypeError, ValueError, AttributeError, bm.CheckFailed) as exc:
            measurements.append({"bench": bench, **params, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]})
            if device == "cuda":
                torch.cuda.empty_cache()
    hardware = db.hardware.get(identity.matched_hardware) if identity.matched_hardware else None
    return CalibrationProfile(
        schema_version=SCHEMA_VERSION, created=now_iso(), mode=mode, complete=complete, device=identity,
        software=software(torch), summary=fit_summary(measurements, llc, hardware),
        measurements=[_plain(m) for m in measurements])


def _plain(measurement: dict) -> dict:
    """YAML-safe: floats stay floats, nothing that is not finite."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in measurement.items()}


def with_models(plan: Plan, models) -> Plan:
    """``plan`` that also times the decode matrices of ``models`` (ModelSpecs; a MoE model adds none)."""
    from calibrate.decoder import decode_matrices

    added = tuple((spec.name, matrices) for spec in models if (matrices := decode_matrices(spec.shape)))
    return replace(plan, model_matrices=plan.model_matrices + added)


def tiny_plan(device: str) -> Plan:
    """The smallest useful plan (tests, CI): a few seconds on two CPU cores."""
    return replace(plan_for(device, "quick"), bandwidth_sizes=(1 * MiB, 8 * MiB, 64 * MiB),
                   matmul_shapes=((1024, 1024),), matmul_rows=(1, 4, 16, 64), gemm_sizes=(64, 512),
                   attention_seqs=(128,), reps=5, kv_expand_bytes=4 * MiB)
