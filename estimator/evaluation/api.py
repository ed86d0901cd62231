"""The public Python API: :func:`estimate` one configuration, :func:`sweep` many.

Both resolve names at the edge, turn specs into columns, and call the same
vectorized :func:`estimator.evaluation.compute.compute_results`; an estimate is a sweep of one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
from pydantic import ValidationError

from estimator.efficiency.calibration_profile import CalibrationProfile, calibration_note
from estimator.efficiency.defaults import PHYSICAL_LIMIT
from estimator.efficiency.engine_profiles import BACKEND_MARK, EngineProfile
from estimator.efficiency.rates import effective_rates
from estimator.errors import ConfigurationError, describe_validation_error
from estimator.evaluation.columns import (
    apply_calibration,
    compute_peak_table,
    format_columns,
    fp4_gemm_table,
    hardware_columns,
    kv_columns,
    model_columns,
    weight_stream_columns,
)
from estimator.evaluation.compute import compute_results
from estimator.evaluation.configurations import Configuration
from estimator.evaluation.intervals import default_backend, interval_columns
from estimator.evaluation.resolve import (
    resolve_calibrated_hardware,
    resolve_engine,
    resolve_hardware,
    resolve_kv_format,
    resolve_model,
    resolve_weight_format,
)
from estimator.evaluation.results import AXES, ResultTable
from estimator.physics.offload import DEFAULT_UBATCH_TOKENS
from estimator.serving.lengths import length_mix
from estimator.serving.workload import (
    DEFAULT_HOST_CPU,
    PER_ROW_COLUMNS,
    Layout,
    ServingOptions,
    as_layout,
    check_layout,
    check_workload,
    scale_up_domain,
)
from estimator.specs.database import Database, load_database
from estimator.specs.formats import KVFormat, WeightFormat, format_family
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec

# Under a load (concurrency or rate) a sweep also returns the steady state; a saturated row has no latencies.
LOAD_COLUMNS = ("steady_batch", "request_rate", "saturated", "max_rate", "ttft_prefill_s", "ttft_p50_s", "ttft_p90_s",
                "ttft_p99_s", "itl_p50_s", "itl_p90_s", "itl_p99_s", "e2e_p99_s", "queued_requests",
                "max_running_sequences", "backlog_wait_s", "run_duration_s", "first_wave_ttft_s")
# With num_requests and no load, a sweep also returns the all-at-once run's phases, limits and percentiles.
ALL_AT_ONCE_COLUMNS = ("prefill_phase_s", "run_duration_s", "running_batch", "max_running_sequences",
                       "queued_requests", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s", "itl_p90_s",
                       "itl_p99_s", "e2e_p99_s")
# The columns a sweep returns unless ``detail=True`` asks for the ledgers too.
MAIN_COLUMNS = ("ttft_s", "prefill_tps", "itl_s", "decode_tps_per_seq", "decode_tps_total", "e2e_latency_s",
                "tpot_inclusive_s", "throughput_out_tps", "prefill_bound", "decode_bound", "memory_required_bytes",
                "memory_available_bytes", "fits", "max_batch")


def sweep(models: Sequence[str | ModelSpec], gpus: Sequence[str | Hardware],
          weight_formats: Sequence[str | WeightFormat] = ("bf16",), kv_formats: Sequence[str | KVFormat] = ("f16",),
          batches: Sequence[int] = (1,), prompt_tokens: Sequence[int] = (512,), output_tokens: Sequence[int] = (256,),
          layouts: Sequence[int | Layout] = (1,), *,
          serving: ServingOptions | Sequence[ServingOptions] | None = None, detail: bool = False,
          calibrations: dict[str, CalibrationProfile] | None = None, engine: str | EngineProfile = "generic",
          physical_limit: bool = False, db: Database | None = None) -> ResultTable:
    """Estimate every combination of the given lists (their cartesian product).

    Parameters
    ----------
    models, gpus : sequence of names or specs
        Names resolve like the CLI's (HF id, alias, NVML name; a model may be a config.json path).
    weight_formats, kv_formats : sequence of names or formats
    batches, prompt_tokens, output_tokens : sequence of int
        Concurrent sequences (over all replicas), prompt length, generated tokens.
    layouts : sequence of int or Layout
        Device layouts; an int N means tensor parallelism over N devices.
    serving : ServingOptions or sequence of them
        KV allocation (paged/contiguous, block size), cached prefix, fused or unfused attention, load; with
        ``lengths`` (a request mix) the mix's mean lengths replace ``prompt_tokens`` and ``output_tokens``.
        Several options form the last axis; they may differ only in the fields that enter as numbers
        (``PER_ROW_COLUMNS``: cached prefix, attention, micro-batch, draft length, acceptance, draft cost).
    calibrations : dict
        Calibration profiles by hardware name: their measured device efficiencies replace the defaults.
    engine : str or EngineProfile
        Serving engine whose fitted efficiencies and overheads apply (``engines_db/``).
    detail : bool
        Also return the FLOP and byte ledgers and the time split per phase.
    physical_limit : bool
        The roofline at 100% of datasheet bandwidth and peak with no overheads, instead of the engine's
        efficiencies: the speed no engine can beat (it caps every prediction interval).

    Returns
    -------
    ResultTable
        Rows in C order over (model, hardware, weight_format, kv_format, layout, batch,
        prompt_tokens, output_tokens, serving); convert with ``.to_pandas()``.

    Examples
    --------
    How many tokens/s does one sequence get from Llama-2-7B in f16, on an H100 vs with 4-bit AWQ?

    >>> table = sweep(["llama-2-7b"], ["h100"], weight_formats=["f16", "int4-awq"], output_tokens=[128])
    >>> [round(v) for v in table.columns["decode_tps_per_seq"]]
    [165, 389]
    """
    db = db or load_database()
    profile_engine = resolve_engine(engine)   # each model as it runs it; mechanisms not modelled are refused
    model_specs = [profile_engine.runs_model(resolve_model(m, db).require_modelled()) for m in models]
    devices = [resolve_hardware(g, db) for g in gpus]
    fmts = [profile_engine.runs(resolve_weight_format(f)) for f in weight_formats]
    kvs = [resolve_kv_format(k) for k in kv_formats]
    layout_specs = [as_layout(v) for v in layouts]
    cases = list(serving) if isinstance(serving, Sequence) else [serving or ServingOptions()]
    serving = _shared_serving(cases)
    if serving.lengths:   # a request mix: its mean lengths replace the given ones
        mix = length_mix(serving.lengths)
        prompt_tokens, output_tokens = [mix.mean_prompt_tokens], [mix.mean_output_tokens]
    check_workload(batches, prompt_tokens, output_tokens, mean_lengths=bool(serving.lengths))
    for case in cases:
        case.check(prompt_tokens, model_specs, layout_specs)
    for spec in model_specs:
        for layout in layout_specs:
            check_layout(spec, layout)
    sizes = (len(model_specs), len(devices), len(fmts), len(kvs), len(layout_specs), len(batches),
             len(prompt_tokens), len(output_tokens), len(cases))

    def on_axis(columns: dict, axis: int) -> dict:
        shape = [1] * len(sizes)
        shape[axis] = sizes[axis]
        return {k: v.reshape(shape) for k, v in columns.items()}

    def values_on_axis(values, axis: int) -> np.ndarray:
        return on_axis({"v": np.asarray(values, dtype=float)}, axis)["v"]

    parameters = PHYSICAL_LIMIT if physical_limit else profile_engine.parameters
    peaks, dtypes = compute_peak_table(fmts, devices)
    f_columns = on_axis(format_columns(fmts, parameters), 2)
    host = None
    if serving.uses_host_cpu:
        cpu = resolve_hardware(serving.host_cpu, db)
        host_peaks, _ = compute_peak_table(fmts, [cpu])
        host = effective_rates(hardware_columns([cpu]), f_columns, values_on_axis(host_peaks[:, 0], 2), parameters)
    draft = None
    if serving.draft_model is not None:
        draft = model_columns([profile_engine.runs_model(resolve_model(serving.draft_model, db).require_modelled())])
    hw_columns = hardware_columns(devices, physical_limit)
    for i, device in enumerate(devices):
        profile = None if physical_limit else (calibrations or {}).get(device.name)
        if profile is not None:
            apply_calibration(hw_columns, i, profile, device)
    hw = on_axis(hw_columns, 1)
    hw["fp4_gemm"] = fp4_gemm_table(dtypes).T.reshape(1, sizes[1], sizes[2], *[1] * (len(sizes) - 3))
    # the decode curve may be a model's own: by model, device and format
    hw.update({k: v.reshape(*sizes[:3], *[1] * (len(sizes) - 3)) for k, v in
               weight_stream_columns(model_specs, devices, fmts, calibrations or {}, physical_limit).items()})
    results = compute_results(
        m=on_axis(model_columns(model_specs), 0), hw=hw,
        f=f_columns, kv=on_axis(kv_columns(kvs), 3), host=host, draft=draft,
        peak_linear_flops_per_s=peaks.T.reshape(1, sizes[1], sizes[2], *[1] * (len(sizes) - 3)),
        layout={k: values_on_axis([x.columns()[k] for x in layout_specs], 4) for k in layout_specs[0].columns()},
        B=values_on_axis(batches, 5), T=values_on_axis(prompt_tokens, 6),
        O=values_on_axis(output_tokens, 7), serving=_serving_columns(cases, profile_engine, devices, on_axis),
        engine=parameters, end_step=detail)
    main = MAIN_COLUMNS + (LOAD_COLUMNS if serving.under_load else ALL_AT_ONCE_COLUMNS if serving.all_at_once else ())
    keep = results if detail else {k: results[k] for k in main}
    columns = {k: np.broadcast_to(v, sizes).ravel() for k, v in keep.items()}
    grids = np.unravel_index(np.arange(int(np.prod(sizes))), sizes)
    labels = {
        "model": [m.name for m in model_specs], "hardware": [d.name for d in devices],
        "weight_format": [f.name for f in fmts], "kv_format": [k.name for k in kvs],
        "layout": [x.label for x in layout_specs], "batch": list(batches), "prompt_tokens": list(prompt_tokens),
        "output_tokens": list(output_tokens), "serving": ServingOptions.labels(cases),
    }
    return ResultTable(columns=columns, index=dict(zip(AXES, grids)), labels=labels, compute_dtypes=dtypes)


def _shared_serving(cases: list[ServingOptions]) -> ServingOptions:
    """What the serving options of one sweep share: all but their per-row fields, which must be all they differ in."""
    if not cases:
        raise ConfigurationError("a sweep needs at least one set of serving options")
    shared = cases[0].shared()
    for case in cases[1:]:
        if case.shared() != shared:
            raise ConfigurationError("serving options of one sweep may differ only in "
                                     f"{', '.join(PER_ROW_COLUMNS)}; sweep the others one call each")
    return cases[0]


def _serving_columns(cases: list[ServingOptions], profile_engine: EngineProfile, devices, on_axis) -> dict:
    """The serving columns, per-row ones on the serving axis (the last), with the engine's own cap on running
    sequences per device when none is given: the batch it runs under a load or in a run, and, whatever the
    workload, the requests its memory profile warms its sampler up on (``profiled_sequences``)."""
    columns = ServingOptions.stacked_columns(cases)
    columns.update(on_axis({key: columns[key] for key in PER_ROW_COLUMNS.values()}, -1))
    serving = cases[0]
    if serving.max_num_seqs is None and profile_engine.scheduler is not None:
        cap = on_axis({"v": np.array([profile_engine.scheduler.max_num_seqs_on(d) for d in devices], dtype=float)},
                      1)["v"]
        columns["profiled_sequences"] = cap
        if serving.engine_sets_batch:
            columns["max_num_seqs"] = cap
    return columns


def _not_finite(value) -> bool:
    """JSON has no inf or NaN: such values are written as null."""
    return isinstance(value, float) and not np.isfinite(value)


def _serving(**options) -> ServingOptions:
    try:
        return ServingOptions(**options)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid serving options: {describe_validation_error(exc)}") from None


@dataclass(frozen=True)
class Estimate(Configuration):
    """One configuration's results with the inputs that produced them.

    ``results`` holds every column of a detailed sweep row (base units: seconds,
    bytes, FLOPs). Speeds are physics-only when ``fits`` is False: the CLI and
    :meth:`to_dict` withhold them then.
    """

    serving: ServingOptions
    engine_profile: EngineProfile = field(repr=False)   # the engine as resolved (on its backend)
    compute_dtype: str
    efficiency_source: str
    results: dict
    warnings: tuple[str, ...] = ()

    @property
    def engine(self) -> str:
        """The engine profile's name (``vLLM``, ``llama.cpp@metal``)."""
        return self.engine_profile.name

    def __getattr__(self, name: str):
        try:
            return self.__dict__["results"][name]
        except KeyError:
            raise AttributeError(name) from None

    @property
    def runnable(self) -> bool:
        """Fits in memory and, under a load, reaches a steady state."""
        return bool(self.results["fits"]) and not self.results.get("saturated", False)

    def to_dict(self) -> dict:
        """JSON-ready: inputs, then results; speeds are None when it does not fit or the load saturates it."""
        speed_keys = {"ttft_s", "prefill_tps", "itl_s", "decode_tps_per_seq", "decode_tps_total",
                      "e2e_latency_s", "tpot_inclusive_s", "throughput_out_tps", "throughput_out_tps_per_gpu",
                      "ttft_prefill_s", "request_rate", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "itl_p50_s",
                      "itl_p90_s", "itl_p99_s", "e2e_p99_s", "itl_end_s", "kv_tier_load_s", "backlog_wait_s",
                      "prefill_launch_excess_s"}
        speed_keys |= {f"{k}_{end}" for k in speed_keys for end in ("low", "high")}
        results = {k: (None if (k in speed_keys and not self.runnable) or _not_finite(v) else v)
                   for k, v in self.results.items()}
        return {
            "model": self.model.name, "hf_id": self.model.hf_id, "hardware": self.hardware.name,
            "n_gpus": self.layout.devices, **self.layout.model_dump(),
            "engine": self.engine, "weight_format": self.weight_format.name, "kv_format": self.kv_format.name,
            "compute_dtype": self.compute_dtype, "batch": self.batch, "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens, **self.serving.model_dump(),
            "efficiency_source": self.efficiency_source,
            **results, "warnings": list(self.warnings),
        }


def estimate(model: str | ModelSpec, gpu: str | Hardware, *, n_gpus: int | None = None, tp: int | None = None,
             pp: int = 1, ep: int = 1, attention_dp: bool = False, devices_per_node: int | None = None,
             network_gbps: float = 400.0,
             weight_format: str | None = None, kv_format: str = "f16", batch: int = 1,
             prompt_tokens: int = 512, output_tokens: int = 256, kv_alloc: str = "paged", kv_block_tokens: int = 16,
             prefix_tokens: int = 0, attention: str = "fused", offload: str = "none", gpu_layers: int | None = None,
             cpu_moe: int | str = 0, ubatch_tokens: int = DEFAULT_UBATCH_TOKENS,
             host_cpu: str = DEFAULT_HOST_CPU, draft_model: str | None = None, draft_tokens: int = 0,
             acceptance: float = 0.7, draft_cost: float = 0.0, concurrency: int = 0, rate: float = 0.0,
             chunked_prefill: int = 0, max_num_seqs: int | None = None, num_requests: int = 0,
             prefix_hit_rate: float = 0.0, lengths: str | None = None, expert_skew: float = 0.0,
             kv_offload: str = "none", kv_offload_gib: float = 0.0,
             calibration: str | CalibrationProfile | None = "auto",
             engine: str | EngineProfile = "generic", db: Database | None = None) -> Estimate:
    """Estimate TTFT, decode speed and memory fit for one configuration.

    Parameters are as in :func:`sweep`, one value each; the layout is given by
    ``n_gpus`` (all of them tensor-parallel unless ``tp``/``pp`` say otherwise;
    what tp × pp leaves over becomes data-parallel replicas), ``ep`` and
    ``attention_dp``. The estimate is a sweep of one row.

    Examples
    --------
    Llama-2-70B in f16 needs two 80 GB cards for its 140 GB of weights:

    >>> one = estimate("llama-2-70b", "h100", weight_format="f16")
    >>> one.fits, round(one.memory_weights_bytes / 1e9)
    (False, 138)
    >>> two = estimate("llama-2-70b", "h100", n_gpus=2, weight_format="f16")
    >>> two.fits, two.decode_bound
    (True, 'memory')
    """
    db = db or load_database()
    spec = resolve_model(model, db)
    # a checkpoint read from disk knows its own format; otherwise bf16
    weight_format = weight_format or getattr(spec, "stored_format", None) or "bf16"
    device, profile = resolve_calibrated_hardware(gpu, calibration, db)
    profile_engine = resolve_engine(engine)
    if BACKEND_MARK not in profile_engine.name:   # the backend the engine usually runs on this device
        profile_engine = profile_engine.on_backend(default_backend(device.vendor, device.device_class.value))
    if tp is None and n_gpus and profile_engine.multi_gpu == "layers" and pp == 1:
        tp, pp = 1, n_gpus   # this engine splits layers across devices: a pipeline
    # a scale-up domain: as given, else the device's own (an NVL72 rack: 72), else an 8-device board
    devices_per_node = devices_per_node or scale_up_domain(device)
    layout = Layout.from_devices(devices=n_gpus, tp=tp, pp=pp, ep=ep, model=spec, devices_per_node=devices_per_node,
                                 network_gbps=network_gbps, attention_dp=attention_dp)
    serving = _serving(kv_alloc=kv_alloc, kv_block_tokens=kv_block_tokens, prefix_tokens=prefix_tokens,
                       attention=attention, offload=offload, gpu_layers=gpu_layers, cpu_moe=cpu_moe,
                       ubatch_tokens=ubatch_tokens, host_cpu=host_cpu,
                       draft_model=draft_model, draft_tokens=draft_tokens, acceptance=acceptance, draft_cost=draft_cost,
                       concurrency=concurrency, rate=rate, chunked_prefill=chunked_prefill,
                       max_num_seqs=max_num_seqs, num_requests=num_requests, prefix_hit_rate=prefix_hit_rate,
                       lengths=lengths,
                       expert_skew=expert_skew, kv_offload=kv_offload, kv_offload_gib=kv_offload_gib)
    table = sweep([spec], [device], [weight_format], [kv_format], [batch], [prompt_tokens], [output_tokens],
                  [layout], serving=serving, detail=True, db=db, engine=profile_engine,
                  calibrations=None if profile is None else {device.name: profile})
    # the lengths evaluated: as given, or a request mix's means
    prompt_tokens, output_tokens = table.labels["prompt_tokens"][0], table.labels["output_tokens"][0]
    row = table.row(0)
    warnings = []
    if tp is None and layout.dp > 1:
        warnings.append(f"layout chosen: {layout.label} (tensor parallelism within one scale-up domain of "
                        f"{devices_per_node} devices, over ranks that split {spec.name}'s heads; replicas beyond); "
                        "give --tp to choose")
    source = "datasheet peaks x default device efficiencies (no calibration profile)"
    source += f"; engine profile {profile_engine.name} ({'fitted' if profile_engine.fit else 'prior, not fitted'})"
    if profile is not None:
        source = calibration_note(profile, device) + f"; engine profile {profile_engine.name}"
        if source.startswith("BORROWED"):
            warnings.append(source)
    if row.get("saturated"):
        warnings.append(f"saturated: the load exceeds what this configuration serves; about "
                        f"{row['max_rate']:.2f} requests/s at most (whole-prompt prefill, KV-cache bound)")
    warnings += profile_engine.implementation_notes(spec)
    if prompt_tokens + output_tokens > spec.shape.max_context:
        warnings.append(f"prompt + output = {prompt_tokens + output_tokens} tokens exceeds {spec.name}'s "
                        f"maximum context of {spec.shape.max_context}")
    results = {k: v for k, v in row.items() if k not in AXES}
    # the roofline at 100% of the datasheet, with the engine's own math dtypes (the peak the estimate uses)
    limit = sweep([spec], [device], [weight_format], [kv_format], [batch], [prompt_tokens], [output_tokens],
                  [layout], serving=serving, detail=True, db=db, engine=profile_engine, physical_limit=True).row(0)
    results.update(interval_columns(results, limit, spec.shape.moe, format_family(row["weight_format"]),
                                    profile_engine.name, device.vendor, device.device_class.value, batch,
                                    serving.under_load, profile is not None, serving.all_at_once,
                                    serving.single_client))
    return Estimate(
        model=spec, hardware=device, weight_format=resolve_weight_format(weight_format),
        kv_format=resolve_kv_format(kv_format), layout=layout, batch=batch, prompt_tokens=prompt_tokens,
        output_tokens=output_tokens, serving=serving, engine_profile=profile_engine,
        compute_dtype=row.pop("compute_dtype"), efficiency_source=source, results=results,
        warnings=tuple(warnings), calibration=profile)


def speculative_speedup_grid(model: str | ModelSpec, gpu: str | Hardware, alphas: Sequence[float],
                             gammas: Sequence[int], **options) -> np.ndarray:
    """Speculative-decoding speed-up for each (γ, α), shape (len(gammas), len(alphas)).

    ``options`` are :func:`estimate`'s (a ``draft_model`` or a ``draft_cost``, batch, format ...).
    Plot it with :func:`estimator.reporting.plots.plot_speculative_speedup`.

    Examples
    --------
    A 1B draft for a 70B target on two H100s, γ = 4: how much faster at α = 0.6 and 0.9?

    >>> grid = speculative_speedup_grid("llama-3.1-70b", "h100", [0.6, 0.9], [4], n_gpus=2,
    ...                                 draft_model="llama-3.2-1b")
    >>> [round(float(v), 1) for v in grid[0]]
    [2.0, 3.5]
    """
    if not (len(alphas) and len(gammas)):
        return np.empty((len(gammas), len(alphas)))
    # the options resolved and checked as for one estimate, then every (γ, α) in one vectorized sweep
    one = estimate(model, gpu, draft_tokens=gammas[0], acceptance=alphas[0], **options)
    cases = [_serving(**{**one.serving.model_dump(), "draft_tokens": g, "acceptance": a})
             for g in gammas for a in alphas]
    calibrations = None if one.calibration is None else {one.hardware.name: one.calibration}
    table = sweep([one.model], [one.hardware], [one.weight_format], [one.kv_format], [one.batch],
                  [one.prompt_tokens], [one.output_tokens], [one.layout], serving=cases, engine=one.engine_profile,
                  detail=True, calibrations=calibrations, db=options.get("db"))
    return table.columns["speculative_speedup"].reshape(len(gammas), len(alphas))
