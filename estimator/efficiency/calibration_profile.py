"""Calibration profiles: what a real device delivered, measured by ``roofline calibrate``.

A profile is YAML written by :mod:`calibrate`; the estimator only reads it, so
this module needs neither torch nor a GPU. Applying a profile replaces the
default *device* efficiencies (:mod:`estimator.efficiency.defaults`) with measured ones:

    device_bandwidth_eff = measured read bandwidth / datasheet bandwidth
    device_compute_eff   = measured GEMM FLOP/s / datasheet dense peak (per dtype)

Engine efficiencies still multiply on top (docs/architecture.md). A device that is
not in the hardware database (a laptop CPU, say) becomes a Hardware entry built
from the profile, with the measured rates as its peaks and efficiency 1.
"""

from __future__ import annotations

import os
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field

from estimator.errors import DatabaseError, load_yaml_model

SCHEMA_VERSION = 3   # 2: summary gained eager_layer_s, eager_expert_s; 3: kv_expand_bytes_per_s (older files load)
ENV_DIR = "ROOFLINE_CALIBRATION_DIR"


class DeviceIdentity(BaseModel):
    """The measured device as the OS / NVML report it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(pattern="^(cpu|cuda|mps)$")
    name: str
    matched_hardware: str | None = Field(default=None, description="hardware_db entry this device resolved to")
    memory_bytes: float = Field(ge=0)
    details: dict = Field(default_factory=dict, description="clocks, bus width, power limit, driver, cores ...")


class BandwidthPoint(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    size_bytes: float = Field(gt=0)
    read_bytes_per_s: float | None = Field(default=None, gt=0)
    copy_bytes_per_s: float | None = Field(default=None, gt=0)


class Summary(BaseModel):
    """The fitted figures the estimator uses, in base units."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    read_bandwidth_bytes_per_s: float = Field(gt=0, description="plateau of a read-only reduction (STREAM-style)")
    copy_bandwidth_bytes_per_s: float | None = Field(default=None, gt=0, description="bytes read + written / s")
    bandwidth_curve: list[BandwidthPoint] = Field(default_factory=list)
    gemm_flops_per_s: dict[str, float] = Field(default_factory=dict, description="best large-GEMM rate per dtype")
    gemv_bytes_per_s: dict[str, float] = Field(default_factory=dict, description="weight-streaming rate at M=1")
    ridge_batch: dict[str, float] = Field(default_factory=dict, description="M where skinny GEMMs turn compute-bound")
    weight_stream_bytes_per_s: dict[str, dict[int, float]] = Field(
        default_factory=dict, description="weights streamed per second by a GEMM of M rows (the decode curve), per "
                                          "dtype and M: weight bytes / median time, the best skinny shape")
    model_weight_stream_bytes_per_s: dict[str, dict[str, dict[int, float]]] = Field(
        default_factory=dict, description="a timed model's own decode curve, per model, dtype and M: its matrices' "
                                          "weight bytes over the time they take together")
    attention_flops_per_s: float | None = Field(default=None, gt=0)
    launch_overhead_s: float | None = Field(default=None, gt=0)
    small_op_chain_s_per_op: float | None = Field(default=None, gt=0)
    sync_overhead_s: float | None = Field(default=None, gt=0)
    eager_layer_s: float | None = Field(
        default=None, gt=0, description="host time per layer of an eager decode step (the reference decoder at tiny "
                                        "shapes: the slope of its step time over depth)")
    eager_expert_s: float | None = Field(
        default=None, gt=0, description="host time per routed expert an eager MoE layer runs (the same decoder with "
                                        "every one of 8 experts routed, over the dense layer)")
    kv_expand_bytes_per_s: float | None = Field(
        default=None, gt=0, description="grouped KV heads copied out to one per query head (repeat_interleave, as "
                                        "Hugging Face's repeat_kv): compact bytes read + expanded bytes written / s")
    host_to_device_bytes_per_s: dict[str, float] = Field(default_factory=dict)
    device_to_host_bytes_per_s: dict[str, float] = Field(default_factory=dict)
    bandwidth_efficiency: float | None = Field(default=None, gt=0, description="read plateau / datasheet")
    compute_efficiency: dict[str, float] = Field(default_factory=dict, description="GEMM / datasheet, per dtype")


class CalibrationProfile(BaseModel):
    """A versioned calibration profile: identity, software, fitted summary and raw measurements."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(ge=1, le=SCHEMA_VERSION)
    created: str
    mode: str = Field(pattern="^(quick|full)$")
    complete: bool = Field(description="False when the run was interrupted; the summary uses what was measured")
    device: DeviceIdentity
    software: dict[str, str]
    summary: Summary
    measurements: list[dict] = Field(default_factory=list, description="every raw measurement, errors included")

    @property
    def label(self) -> str:
        return f"{self.device.name}, {self.created[:10]} ({self.mode}{'' if self.complete else ', interrupted'})"


def load_profile(path: str | os.PathLike) -> CalibrationProfile:
    """Read and validate a profile, with a clear error for a bad file."""
    return load_yaml_model(path, CalibrationProfile, f"calibration profile (schema v{SCHEMA_VERSION})")


def save_profile(profile: CalibrationProfile, path: str | os.PathLike, force: bool = False) -> Path:
    """Write a profile; never over an existing file unless ``force``."""
    path = Path(path)
    if path.exists() and not force:
        raise DatabaseError(f"{path} exists; pass --force to overwrite it, or choose another --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(profile.model_dump(mode="json"), sort_keys=False))
    return path


def profile_dir() -> Path:
    """Where `roofline calibrate` keeps profiles and the estimator looks for them."""
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".config" / "llm-roofline" / "calibrations")


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def default_profile_path(device_name: str) -> Path:
    """A new file per run, so no earlier profile is overwritten; the newest one is used."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    return profile_dir() / f"{slug(device_name)}-{stamp}.yaml"


def find_profile(*names: str) -> CalibrationProfile | None:
    """The newest profile in :func:`profile_dir` for a device of any of these names (any device if none given)."""
    wanted = {slug(n) for n in names if n}
    folder = profile_dir()
    if not folder.is_dir():
        return None
    found = []
    for path in folder.glob("*.yaml"):
        try:
            profile = load_profile(path)
        except DatabaseError:
            continue
        if not wanted or {slug(profile.device.name), slug(profile.device.matched_hardware or "")} & wanted:
            found.append(profile)
    return max(found, key=lambda p: p.created, default=None)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


def device_efficiencies(profile: CalibrationProfile, hw, compute_dtypes) -> tuple[float, float | None]:
    """Measured device efficiencies for ``hw``: bandwidth and compute (first dtype measured). A profile of another
    device is applied as a ratio to ``hw``'s own datasheet (:func:`calibration_note` says so)."""
    s = profile.summary
    bandwidth_eff = s.read_bandwidth_bytes_per_s / hw.memory_bandwidth_bytes_per_s
    compute_eff = None
    for dtype in compute_dtypes:
        measured, peak = s.gemm_flops_per_s.get(dtype), hw.peak_flops_per_s(dtype)
        if measured and peak:
            compute_eff = measured / peak
            break
    return min(bandwidth_eff, 1.0), None if compute_eff is None else min(compute_eff, 1.0)


def calibration_note(profile: CalibrationProfile, hw) -> str:
    """Which profile set ``hw``'s rates, or a warning that it is another device's (a profile copied across GPUs is
    a known source of error, BLIS #1711)."""
    own = hw.name in (profile.device.matched_hardware, calibrated_name(profile))
    return f"calibrated: {profile.label}" if own else \
        f"BORROWED calibration of {profile.device.name} applied to {hw.name}: treat with care"


# The rows the weight-stream curve is read at (the quick plan measures these; the full plan more).
WEIGHT_STREAM_ROWS = (1, 4, 16, 64, 256)
# A format's stored dtype, for the formats a calibration's GEMMs measure (quantized formats have no curve).
CURVE_DTYPE_OF_FORMAT = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}


def weight_stream_efficiencies(profile: CalibrationProfile, hw, fmt_name: str,
                               model: str | None = None) -> list[float] | None:
    """The measured weight-stream rate of a GEMM of M rows as a fraction of ``hw``'s datasheet bandwidth, at each
    of :data:`WEIGHT_STREAM_ROWS` (None when the profile has no curve for the format's dtype): ``model``'s own
    curve where the profile timed that model's matrices, else the calibration shape's.

    On a CPU a matrix-vector product streams weights well below a read loop's plateau (about 24 GB/s against
    42 on the 2-core machine of docs/formulas.md §13), and a few rows more can be slower still: the read
    plateau overstates decode there, the curve does not. A row count between two measured ones is
    interpolated in log M by the estimate."""
    dtype = CURVE_DTYPE_OF_FORMAT.get(fmt_name, "")
    own = profile.summary.model_weight_stream_bytes_per_s.get(model or "", {}).get(dtype)
    curve = own if _usable(own) else profile.summary.weight_stream_bytes_per_s.get(dtype)
    if not _usable(curve):
        return None
    rows = sorted(curve)
    rates = np.interp(np.log(WEIGHT_STREAM_ROWS), np.log(rows), [curve[m] for m in rows])
    return [min(float(r) / hw.memory_bandwidth_bytes_per_s, 1.0) for r in rates]


def _usable(curve: dict[int, float] | None) -> bool:
    """A curve the estimate can read: the one-row rate and at least one more."""
    return bool(curve) and 1 in curve and len(curve) >= 2


def weight_stream_eff_at(curve: list, tokens) -> np.ndarray:
    """The curve (one efficiency per row count of WEIGHT_STREAM_ROWS) at ``tokens`` rows, piecewise linear in
    log M and flat outside the measured rows; NaN where the device has no curve."""
    x = np.log(np.clip(np.asarray(tokens, dtype=float), WEIGHT_STREAM_ROWS[0], WEIGHT_STREAM_ROWS[-1]))
    grid = np.log(WEIGHT_STREAM_ROWS)
    out = curve[0] + 0 * x
    for i in range(len(grid) - 1):
        step = np.clip((x - grid[i]) / (grid[i + 1] - grid[i]), 0.0, 1.0)
        out = out + step * (curve[i + 1] - curve[i])
    return out


def calibrated_name(profile: CalibrationProfile) -> str:
    return f"{profile.device.name} (calibrated)"


def hardware_from_profile(profile: CalibrationProfile):
    """A Hardware entry for a calibrated device that the database does not know (measured rates as peaks)."""
    from estimator.specs.hardware import Hardware

    source = f"calibration profile of {profile.label}"
    q = lambda value, unit, note=None: {"value": value, "unit": unit, "source": source, "note": note}  # noqa: E731
    s = profile.summary
    kind = {"cpu": "cpu", "mps": "soc_unified", "cuda": "consumer_gpu"}[profile.device.kind]
    peaks = {d: q(v / 1e12, "TFLOPS", "measured GEMM rate, used as the peak") for d, v in s.gemm_flops_per_s.items()}
    return Hardware.model_validate({
        "name": calibrated_name(profile), "aliases": ["local"], "vendor": "unknown",
        "device_class": kind, "release_year": q(int(profile.created[:4]), "year", "year of the calibration"),
        "memory": {"type": "unknown", "capacity": q(profile.device.memory_bytes, "B", "reported by the OS/driver"),
                   "bandwidth": q(s.read_bandwidth_bytes_per_s / 1e9, "GB/s", "measured read plateau")},
        "dense_peak": peaks, "tdp": q(0, "W", "not measured"),
        "notes": "built from a calibration profile: peaks are measured rates, so device efficiencies are 1",
    })
