"""Names to specs: a model, device, engine or format as the user gives it, resolved against the database.

A device may come with a calibration profile (``roofline calibrate``) whose measured rates replace its
datasheet efficiencies; ``--gpu local`` is the device a profile measured.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from estimator.efficiency.calibration_profile import (
    CalibrationProfile,
    find_profile,
    hardware_from_profile,
    load_profile,
    profile_dir,
)
from estimator.efficiency.engine_profiles import EngineProfile
from estimator.efficiency.engine_profiles import engine as engine_profile
from estimator.errors import ConfigurationError, describe_validation_error
from estimator.specs.database import Database
from estimator.specs.formats import KVFormat, WeightFormat, kv_format, weight_format
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec


def resolve_model(model: str | ModelSpec, db: Database) -> ModelSpec:
    """A spec, a database name/alias/HF id, or a local checkpoint: see estimator.specs.checkpoint."""
    from estimator.physics.params import count_params
    from estimator.specs.checkpoint import read_local_model
    return model if isinstance(model, ModelSpec) else read_local_model(model, count_params) or db.models.get(model)


def resolve_hardware(gpu: str | Hardware, db: Database, memory_gib: float | None = None) -> Hardware:
    """A spec or a database name; with ``memory_gib``, that one of the memory sizes it is sold with."""
    device = gpu if isinstance(gpu, Hardware) else db.hardware.get(gpu)
    return device if memory_gib is None else device.with_memory_gib(memory_gib)


def resolve_engine(value: str | EngineProfile) -> EngineProfile:
    return value if isinstance(value, EngineProfile) else engine_profile(value)


def resolve_weight_format(fmt: str | WeightFormat) -> WeightFormat:
    return fmt if isinstance(fmt, WeightFormat) else weight_format(fmt)


def resolve_kv_format(fmt: str | KVFormat) -> KVFormat:
    return fmt if isinstance(fmt, KVFormat) else kv_format(fmt)


def resolve_calibrated_hardware(gpu: str | Hardware, calibration, db: Database, memory_gib: float | None = None):
    """The device, and the calibration profile to apply to it (or None).

    ``gpu="local"`` is the device of the given profile, or of the newest one in the
    calibration folder; a device the database does not know is built from its profile.
    ``calibration`` is a profile, a path, ``"auto"`` (the newest profile of this device
    in the calibration folder, if any) or None. ``memory_gib`` picks one of the memory
    sizes the device is sold with (:meth:`Hardware.with_memory_gib`); None keeps the largest.
    """
    if isinstance(calibration, (str, Path)) and str(calibration) not in ("auto", "none"):
        calibration = load_profile(calibration)
    if isinstance(gpu, str) and gpu.strip().lower() == "local":
        profile = _measured(calibration if isinstance(calibration, CalibrationProfile) else find_profile())
        if profile is None:
            raise ConfigurationError(f"--gpu local needs a calibration profile: run `roofline calibrate` first "
                                     f"(profiles are kept in {profile_dir()}) or pass --calibration FILE")
        matched = profile.device.matched_hardware
        return resolve_hardware(db.hardware.get(matched) if matched else _device_of(profile), db, memory_gib), profile
    device = resolve_hardware(gpu, db, memory_gib)
    if calibration == "auto":
        return device, _measured(find_profile(device.name, *device.aliases))
    return device, _measured(calibration) if isinstance(calibration, CalibrationProfile) else None


# The range of rates (bytes/s, FLOP/s) a profile can have measured on a real device.
MEASURED_RATES = (1e6, 1e18)


def _measured(profile: CalibrationProfile | None) -> CalibrationProfile | None:
    """The profile, unless a rate the estimate uses is outside what any device measures."""
    if profile is None:
        return None
    s = profile.summary
    low, high = MEASURED_RATES
    for field, value in (("read_bandwidth_bytes_per_s", s.read_bandwidth_bytes_per_s),
                         *((f"gemm_flops_per_s.{d}", v) for d, v in s.gemm_flops_per_s.items())):
        if not low <= value <= high:
            raise ConfigurationError(f"the calibration profile of {profile.device.name!r}: summary.{field} = "
                                     f"{value:g} is not a measured rate; expected {low:g} to {high:g}")
    return profile


def _device_of(profile: CalibrationProfile) -> Hardware:
    """The device a profile measured, where the database does not know it; an error if the profile cannot be one."""
    try:
        return hardware_from_profile(profile)
    except ValidationError as exc:
        problem = describe_validation_error(exc)
    except ValueError as exc:
        problem = str(exc)
    raise ConfigurationError(f"the calibration profile of {profile.device.name!r} does not describe a device: "
                             f"{problem}")
