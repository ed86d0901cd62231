"""A list of configurations (rows, not a product) as columns, evaluated with any engine parameters.

``roofline predict`` and the fit evaluate the same measured configurations hundreds of times with
different engine parameters; everything that does not depend on the engine is gathered once here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from estimator.efficiency.calibration_profile import WEIGHT_STREAM_ROWS, CalibrationProfile, weight_stream_efficiencies
from estimator.efficiency.defaults import PHYSICAL_LIMIT, EngineDefaults
from estimator.efficiency.engine_profiles import EngineProfile
from estimator.efficiency.engine_profiles import engine as engine_profile
from estimator.efficiency.rates import effective_rates
from estimator.evaluation.columns import (
    WEIGHT_STREAM_KEYS,
    apply_calibration,
    compute_peak_table,
    format_columns,
    fp4_gemm_table,
    hardware_columns,
    kv_columns,
    model_columns,
)
from estimator.evaluation.compute import compute_results
from estimator.serving.workload import Layout, ServingOptions, check_workload
from estimator.specs.database import load_database
from estimator.specs.formats import KVFormat, WeightFormat
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec


@dataclass(frozen=True)
class Configuration:
    """One row of a configuration list, already resolved to specs."""

    model: ModelSpec
    hardware: Hardware
    weight_format: WeightFormat
    kv_format: KVFormat
    layout: Layout
    batch: int
    prompt_tokens: float   # whole in an estimate; a dataset's mean in a predicted row
    output_tokens: float
    # the calibration profile applied, if any (`--calibration`, a measurement's `calibration` column): its
    # measured rates replace the device's defaults for this configuration
    calibration: CalibrationProfile | None = field(default=None, repr=False, compare=False, kw_only=True)


def _gather(items, columns_of):
    """Columns of the distinct items, repeated in the order of ``items``, with the distinct items and index."""
    unique = list({id(x): x for x in items}.values())
    position = {id(x): i for i, x in enumerate(unique)}
    index = np.array([position[id(x)] for x in items])
    return {k: v[index] for k, v in columns_of(unique).items()}, unique, index


@dataclass(frozen=True)
class ConfigurationColumns:
    """A list of configurations as columns, ready to evaluate with any engine parameters (rows, not a product).

    Everything that does not depend on the engine is gathered once, so a fit that evaluates the same
    rows hundreds of times pays for it once.
    """

    m: dict
    hw: dict
    kv: dict
    formats: list
    format_index: np.ndarray
    peak_linear_flops_per_s: np.ndarray
    batch: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    layout: dict

    @classmethod
    def of(cls, configs: Sequence[Configuration], physical_limit: bool = False) -> "ConfigurationColumns":
        check_workload([c.batch for c in configs], [c.prompt_tokens for c in configs],
                       [c.output_tokens for c in configs], mean_lengths=True)
        m, _, _ = _gather([c.model for c in configs], model_columns)
        hw, devices, hw_index = _gather([c.hardware for c in configs], lambda u: hardware_columns(u, physical_limit))
        if not physical_limit:
            _apply_calibrations(hw, configs)
        formats = list({id(c.weight_format): c.weight_format for c in configs}.values())
        position = {id(f): i for i, f in enumerate(formats)}
        f_index = np.array([position[id(c.weight_format)] for c in configs])
        kv, _, _ = _gather([c.kv_format for c in configs], kv_columns)
        peaks, dtypes = compute_peak_table(formats, devices)
        hw["fp4_gemm"] = fp4_gemm_table(dtypes)[f_index, hw_index]
        layouts = [c.layout.columns() for c in configs]
        return cls(m, hw, kv, formats, f_index, peaks[f_index, hw_index],
                   np.array([c.batch for c in configs], dtype=float),
                   np.array([c.prompt_tokens for c in configs], dtype=float),
                   np.array([c.output_tokens for c in configs], dtype=float),
                   {k: np.array([x[k] for x in layouts], dtype=float) for k in layouts[0]})

    def results(self, serving: ServingOptions, parameters: EngineDefaults, batch: np.ndarray | None = None,
                serving_columns: dict | None = None) -> dict[str, np.ndarray]:
        """Every result column; ``serving_columns`` (rows' own prefix, attention, micro-batch:
        :meth:`ServingOptions.stacked_columns`) replace ``serving``'s own."""
        f = {k: v[self.format_index] for k, v in format_columns(self.formats, parameters).items()}
        host = None
        if serving.cpu_moe != 0:   # experts on the host CPU: its rates with this engine and format, as in sweep()
            cpu = load_database().hardware.get(serving.host_cpu)
            host_peaks, _ = compute_peak_table(self.formats, [cpu])
            host = effective_rates(hardware_columns([cpu]), f, host_peaks[self.format_index, 0], parameters)
        return compute_results(m=self.m, hw=self.hw, f=f, kv=self.kv, host=host,
                               peak_linear_flops_per_s=self.peak_linear_flops_per_s,
                               B=self.batch if batch is None else batch, T=self.prompt_tokens, O=self.output_tokens,
                               layout=self.layout, serving=serving.columns() if serving_columns is None
                               else serving_columns, engine=parameters)


def _apply_calibrations(hw: dict, configs: Sequence[Configuration]) -> None:
    """Each calibrated row's measured rates in place of its device's defaults (``hw`` has one entry per row), and
    its profile's decode curve for the row's model and format where the profile measured one."""
    curves = np.full((len(WEIGHT_STREAM_ROWS), len(configs)), np.nan)
    for i, c in enumerate(configs):
        if c.calibration is None:
            continue
        apply_calibration(hw, i, c.calibration, c.hardware)
        found = weight_stream_efficiencies(c.calibration, c.hardware, c.weight_format.name, c.model.name)
        if found:
            curves[:, i] = found
    if not np.isnan(curves).all():
        hw.update(zip(WEIGHT_STREAM_KEYS, curves))


def results_for_configurations(configs: Sequence[Configuration], serving: ServingOptions | None = None,
                               engine: str | EngineProfile = "generic",
                               physical_limit: bool = False) -> dict[str, np.ndarray]:
    """Evaluate an arbitrary list of configurations in one vectorized call (rows, not a product).

    With ``physical_limit`` the rows are timed at 100% of datasheet bandwidth and peak, with no overheads.
    """
    if physical_limit:
        parameters = PHYSICAL_LIMIT
    else:
        parameters = (engine if isinstance(engine, EngineProfile) else engine_profile(engine)).parameters
    return ConfigurationColumns.of(configs, physical_limit).results(serving or ServingOptions(), parameters)
