"""The `roofline` command line: parse, check, load specs, call the library, format, print.

Every input is checked at the edge: each flag's value by its argparse type, files by the
readers in :mod:`estimator.errors`, and a flag the chosen mode would not use is refused, never
silently ignored. Exit codes: 0 success; 2 invalid input, with one line on stderr naming the
input, its value and what is accepted; 3 an unexpected error (one line; ``--debug`` prints the
traceback); 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from pathlib import Path
from typing import Sequence

from estimator.cli_flags import EXIT_INVALID, parse
from estimator.errors import (
    ConfigurationError,
    RooflineError,
    describe_validation_error,
    prepare_output,
    read_text,
    write_atomically,
)
from estimator.evaluation.api import estimate, resolve_calibrated_hardware, speculative_speedup_grid
from estimator.evaluation.resolve import resolve_engine, resolve_model
from estimator.formatting import stderr_progress, to_json
from estimator.planning import disaggregation as disagg
from estimator.reporting import catalog
from estimator.reporting.estimate_text import (
    format_disaggregation,
    format_estimate,
    format_speculation,
    local_sections,
)
from estimator.reporting.explain import explain
from estimator.reporting.measured import measured_rows
from estimator.reporting.verify import verify_commands
from estimator.specs.database import load_database
from estimator.units import GiB
from estimator.validation import predict

EXIT_OK, EXIT_UNEXPECTED, EXIT_INTERRUPTED = 0, 3, 130


def _estimate_kwargs(args: argparse.Namespace) -> dict:
    """The flags as keyword arguments of :func:`estimator.evaluation.api.estimate`."""
    chosen = getattr(args, "device", None)   # --memory-gib: the device and its profile, resolved by run()
    return dict(
        model=args.model, gpu=chosen or args.gpu, n_gpus=args.gpus, tp=args.tp, pp=args.pp, ep=args.ep,
        attention_dp=args.attention_dp,
        devices_per_node=args.devices_per_node, network_gbps=args.network_gbps,
        weight_format=args.format, kv_format=args.kv_format, batch=args.batch, prompt_tokens=args.prompt,
        output_tokens=args.output, kv_alloc=args.kv_alloc, kv_block_tokens=args.kv_block,
        prefix_tokens=args.prefix_tokens, attention=args.attention, offload=args.offload,
        gpu_layers=args.gpu_layers, host_cpu=args.host_cpu, draft_model=args.draft_model,
        draft_tokens=args.draft_tokens, acceptance=args.acceptance, draft_cost=args.draft_cost,
        concurrency=args.concurrency, rate=args.rate, chunked_prefill=args.chunked_prefill,
        max_num_seqs=args.max_num_seqs, num_requests=args.num_requests or 0, prefix_hit_rate=args.prefix_hit_rate, lengths=args.lengths,
        expert_skew=args.expert_skew, kv_offload=args.kv_offload, kv_offload_gib=args.kv_offload_gib,
        calibration=args.profile if chosen else None if args.calibration == "none" else args.calibration,
        engine=args.engine, cpu_moe="all" if args.cpu_moe else (args.n_cpu_moe or 0),
        ubatch_tokens=args.ubatch_size)


def _refuse(args: argparse.Namespace, dests: Sequence[str], why: str) -> None:
    """Refuse the given options among ``dests``: the chosen mode would not use them."""
    given = [args.given[d] for d in dests if d in args.given]
    if given:
        raise ConfigurationError(f"{', '.join(given)}: {why}")


DISAGGREGATION = ("prefill_gpus", "decode_gpus")
TARGETS = ("max_ttft_s", "max_itl_s", "max_gpus")


def _check_estimate(args: argparse.Namespace) -> None:
    if args.command != "estimate":
        _refuse(args, DISAGGREGATION + TARGETS, f"disaggregated serving is a mode of `roofline estimate`, "
                                                f"not of `roofline {args.command}`")
    elif any(d in args.given for d in DISAGGREGATION):
        _refuse(args, ("batch", "gpus", "concurrency", "chunked_prefill"), "not used by disaggregated serving, "
                "whose pools are --prefill-gpus and --decode-gpus and whose load is --rate; drop them")
        if not (args.max_ttft_s or args.max_itl_s):
            _refuse(args, ("max_gpus",), "limits the fewest-devices search, which needs --max-ttft-s or --max-itl-s")
    else:
        _refuse(args, TARGETS, "targets of the disaggregated-serving search; add --prefill-gpus X --decode-gpus Y")
    if args.command == "speculation":
        _refuse(args, ("draft_tokens", "acceptance"), "`roofline speculation` sweeps γ and α itself; drop them")
        if args.out:
            _image_output(args.out, args.force, "--out")
        else:
            _refuse(args, ("force",), "overwrites --out; add --out FILE")
    if args.concurrency or args.rate:
        _refuse(args, ("batch",), "under --concurrency or --rate the batch is the steady state; drop --batch")
    if args.lengths:
        _refuse(args, ("prompt", "output"), f"--lengths {args.lengths} gives every request's lengths; drop them")
    if not args.draft_tokens:
        _refuse(args, ("acceptance",), "applies to speculative decoding; add --draft-tokens G")
    if args.gpu_layers is None and not (args.cpu_moe or args.n_cpu_moe):
        _refuse(args, ("host_cpu",), "runs what --gpu-layers or --cpu-moe leaves to the host; add one of them")
    if args.kv_alloc == "contiguous":
        _refuse(args, ("kv_block",), "sizes paged KV blocks, which --kv-alloc contiguous does not use")
    if not (args.cpu_moe or args.n_cpu_moe or _runs_prompts_in_micro_batches(args.engine)):
        _refuse(args, ("ubatch_size",), "llama.cpp's micro-batch, used by an engine that runs prompts in micro-batches "
                                        "(--engine llama.cpp) or with experts on the host (--cpu-moe); drop it")


def _runs_prompts_in_micro_batches(name: str | None) -> bool:
    """Whether the named engine runs prompts in micro-batches; True for a name that does not resolve, whose error
    the estimate itself reports."""
    try:
        return resolve_engine(name or "generic").parameters.prefill_in_ubatches
    except RooflineError:
        return True


PLAN_FLAGS = ("model", "prompt", "output", "concurrency", "rate", "max_num_seqs", "max_ttft_s", "min_tps_per_user",
              "percentile", "latency_percentile", "formats", "min_bits", "gpus", "max_gpus", "on_prem", "budget",
              "engine", "price", "devices_per_node")


def _check_plan(args: argparse.Namespace) -> None:
    if args.plan_file:
        _refuse(args, PLAN_FLAGS, f"the plan file {args.plan_file} sets the plan; put them in the file, "
                                  "or drop the file")
    elif not (args.concurrency or args.rate):
        _refuse(args, ("latency_percentile",), "latency percentiles come from the queueing model under a load; "
                                               "add --concurrency C or --rate R")


def _check_validate(args: argparse.Namespace) -> None:
    if args.published:
        _refuse(args, ("device", "model", "quick", "batch", "prompt", "output", "calibration"),
                "apply to --local, not --published")
    else:
        _refuse(args, ("write", "plot", "jobs", "no_cache"), "apply to --published, not --local")
    if not (args.plot or args.write):
        _refuse(args, ("force",), "overwrites the files of --plot or --write; add one of them")
    if args.write:
        if not os.path.isdir(args.write):
            raise ConfigurationError(f"--write {args.write}: not a folder; give the engines_db folder to update")
        if not args.force:
            raise ConfigurationError(f"--write {args.write} rewrites the engine files there; pass --force to "
                                     "overwrite them")
    if args.plot:
        _image_output(args.plot, args.force, "--plot")


def _check_calibrate(args: argparse.Namespace) -> None:
    if args.compare:
        _refuse(args, ("device", "mode", "out", "force", "db", "model"),
                "not used by --compare, which only reads two profiles")
    elif args.out:
        prepare_output(args.out, args.force, "--out")
    else:
        _refuse(args, ("force",), "overwrites --out; add --out FILE")


def _check_list(args: argparse.Namespace) -> None:
    unused = {"gpus": ("family", "moe"), "models": ("vendor", "device_class", "min_memory_gib"),
              "formats": ("vendor", "device_class", "family", "min_memory_gib", "moe", "db")}[args.what]
    _refuse(args, unused, f"not used by `roofline list {args.what}`")


def _check_predict(args: argparse.Namespace) -> None:
    if "\x00" in read_text(args.csv, "--csv", ConfigurationError):
        raise ConfigurationError(f"--csv {args.csv} holds NUL characters; give a text CSV file")
    prepare_output(args.out, args.force, "--out")


CHECKS = {"estimate": _check_estimate, "explain": _check_estimate, "speculation": _check_estimate,
          "plan": _check_plan, "validate": _check_validate, "calibrate": _check_calibrate, "list": _check_list,
          "predict": _check_predict}


def run(args: argparse.Namespace) -> str:
    """Execute a command parsed by :func:`estimator.cli_flags.parse` and return what to print."""
    CHECKS.get(args.command, lambda _: None)(args)
    db = load_database(args.db)
    if getattr(args, "memory_gib", None) is not None:   # one of the memory sizes the device is sold with
        args.device, args.profile = resolve_calibrated_hardware(
            args.gpu, None if args.calibration == "none" else args.calibration, db, memory_gib=args.memory_gib)
    if args.command == "estimate" and (args.prefill_gpus or args.decode_gpus):
        return _disaggregation(args, db)
    if args.command == "estimate":
        e = estimate(**_estimate_kwargs(args), db=db)
        measured, commands = measured_rows(e), verify_commands(e)
        if args.json:
            return to_json({**e.to_dict(), "memory_gib": e.hardware.memory_capacity_bytes / GiB,
                            "memory_options_gib": e.hardware.memory_options_gib,
                            "measured": measured, "verify_command": commands})
        return format_estimate(e, measured, commands)
    if args.command == "explain":
        return _explain(args, db)
    if args.command == "report":
        from estimator.reporting.procurement import write_report
        return write_report(args.plan_file, args.out, args.format, force=args.force, db=db)
    if args.command == "plan":
        return _plan(args, db)
    if args.command == "validate":
        return _validate(args, db)
    if args.command == "calibrate":
        return _calibrate(args, db)
    if args.command == "speculation":
        return _speculation(args, db)
    if args.command == "list":
        return catalog.list_entries(db, args)
    if args.command == "show":
        return catalog.show_entry(db, args.what, args.name, as_json=args.json)
    if args.command == "check":
        return catalog.check_database(db)
    if args.command == "predict":
        return predict.predict_file(args.csv, args.out, db=db, force=args.force)
    raise AssertionError(args.command)  # argparse restricts the choices


def _calibrate(args: argparse.Namespace, db) -> str:
    from estimator.efficiency.calibration_profile import default_profile_path, load_profile, save_profile
    try:
        from calibrate.run import calibrate, plan_for, tiny_plan, with_models
        from calibrate.summary import compare, format_profile
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from None
    if args.compare:
        return compare(*(load_profile(p) for p in args.compare))
    mode = "quick" if args.mode in (None, "smoke") else args.mode
    plan = tiny_plan(args.device) if args.mode == "smoke" else plan_for(args.device, mode)
    if args.model:
        plan = with_models(plan, [_dense_model(name, db) for name in args.model])
    profile = calibrate(args.device, mode, plan=plan, db=db, progress=stderr_progress)
    out = write_atomically(args.out or default_profile_path(profile.device.name),
                           lambda path: save_profile(profile, path, force=True), args.force or not args.out, "--out")
    hardware = db.hardware.get(profile.device.matched_hardware) if profile.device.matched_hardware else None
    return format_profile(profile, hardware) + f"\nprofile written to {out}"


def _dense_model(name: str, db):
    """A model whose decode matrices a calibration can time: in the database, with matrices to time (dense)."""
    from calibrate.decoder import decode_matrices

    spec = resolve_model(name, db)
    if not decode_matrices(spec.shape):
        raise ConfigurationError(f"--model {name}: {spec.name} is a mixture of experts; calibrate --model times "
                                 "a dense model's decode matrices (its experts run on the tokens that chose them)")
    return spec


def plan_from_args(args: argparse.Namespace):
    """A PlanSpec from a plan file, or from the flags given (the same keys; the plan's defaults fill the rest)."""
    from pydantic import ValidationError

    from estimator.planning.spec import PlanSpec, load_plan
    if args.plan_file:
        return load_plan(args.plan_file)
    if not args.model:
        raise ConfigurationError("give a plan file, or --model with --prompt and --output (or --lengths) and "
                                 "--concurrency or --rate")

    def given(**keys) -> dict:
        return {key: getattr(args, dest) for key, dest in keys.items() if getattr(args, dest)}

    price_key = "purchase_usd" if args.on_prem else "cloud_usd_per_hour"
    try:
        return PlanSpec.model_validate({
            "models": args.model, **given(engine="engine"),
            "workload": given(prompt="prompt", output="output", lengths="lengths", concurrency="concurrency",
                              rate="rate", max_num_seqs="max_num_seqs", prefix_hit_rate="prefix_hit_rate"),
            "targets": given(max_ttft_s="max_ttft_s", min_tps_per_user="min_tps_per_user", percentile="percentile",
                             latency_percentile="latency_percentile"),
            "constraints": {**given(formats="formats", min_bits="min_bits", gpus="gpus", max_gpus="max_gpus",
                                    budget_usd="budget", devices_per_node="devices_per_node"),
                            "deployment": "on_prem" if args.on_prem else "cloud"},
            "prices": {"devices": {name: {price_key: usd} for name, usd in args.price}}})
    except ValidationError as exc:
        raise ConfigurationError(f"invalid plan: {describe_validation_error(exc)}") from None


def _plan(args: argparse.Namespace, db) -> str:
    from estimator.planning.search import plan
    from estimator.reporting.plan_text import format_plan
    result = plan(plan_from_args(args), db=db)
    return to_json(result.to_dict()) if args.json else format_plan(result)


def _explain(args: argparse.Namespace, db) -> str:
    """`roofline explain`, with the measured rows and the commands to verify it, as for an estimate."""
    text = explain(_estimate_kwargs(args), db=db, as_json=args.json)
    e = estimate(**_estimate_kwargs(args), db=db)
    measured, commands = measured_rows(e), verify_commands(e)
    if args.json:
        return to_json({**json.loads(text), "measured": measured, "verify_command": commands})
    return "\n".join([text, *local_sections(measured, commands)])


def _validate(args: argparse.Namespace, db) -> str:
    if args.local:
        from estimator.validation.local import validate_local
        return validate_local(args.device, args.model, quick=args.quick, db=db, as_json=args.json,
                              batches=args.batch, prompts=args.prompt, output_tokens=args.output,
                              calibration=args.calibration, progress=stderr_progress)
    from estimator.validation import published as val
    try:
        result = val.run(db=db, jobs=args.jobs, cache=not args.no_cache, progress=lambda done, total: stderr_progress(
            f"leave-one-source-out: {done} of {total} sources"))
    except ImportError as exc:
        raise ConfigurationError(f"fitting needs the fit extra: pip install 'llm-roofline[fit]' ({exc})") from None
    if result.from_cache:
        stderr_progress("leave-one-source-out: the result kept for the same data, code and library versions "
                        "(--no-cache recomputes)")
    written = {}
    if args.plot:
        written["plot"] = str(_save_validation_plot(result, args))
    if args.write:
        written["wrote"] = val.write_results(result, args.write)
    if args.json:
        return to_json({**val.to_json(result), **written})
    return "\n".join([val.format_validation(result), *(f"{key}: {value}" for key, value in written.items())])


def _image_output(path: str, force: bool, flag: str) -> str:
    """Check an image path before any work (see :func:`prepare_output`); the type follows its suffix (PNG if none)."""
    kind = os.path.splitext(path)[1].lstrip(".").lower() or "png"
    if kind not in ("png", "svg", "pdf"):
        raise ConfigurationError(f"{flag} {path}: cannot write a .{kind} image; use .png, .svg or .pdf")
    prepare_output(path, force, flag)
    return kind


def _save_figure(path: str, flag: str, force: bool, size: tuple[float, float], draw) -> Path:
    """Draw on a new figure with ``draw(ax)`` and save it, never over an existing file without --force."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kind = _image_output(path, force, flag)
    fig, ax = plt.subplots(figsize=size)
    try:
        draw(ax)
        fig.tight_layout()
        out = write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120, format=kind), force, flag)
    finally:
        plt.close(fig)
    return out


def _save_validation_plot(result, args) -> Path:
    from estimator.reporting.plots import plot_predicted_vs_measured
    return _save_figure(args.plot, "--plot", args.force, (7, 6), lambda ax: plot_predicted_vs_measured(
        ax, result.problem.measured, result.predicted, result.labels()["engine"],
        title="roofline predict vs published measurements (leave one source out)"))


SPECULATION_ALPHAS = (0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
SPECULATION_GAMMAS = (1, 2, 3, 4, 6, 8)


def _speculation(args: argparse.Namespace, db) -> str:
    kwargs = {k: v for k, v in _estimate_kwargs(args).items() if k not in ("draft_tokens", "acceptance")}
    if not (kwargs["draft_model"] or kwargs["draft_cost"]):
        kwargs["draft_cost"] = 0.05
    grid = speculative_speedup_grid(**kwargs, alphas=SPECULATION_ALPHAS, gammas=SPECULATION_GAMMAS, db=db)
    draft = kwargs["draft_model"] or f"heads at {kwargs['draft_cost']:g} of a step"
    plot = {"plot": str(_save_speculation_plot(args, grid, draft))} if args.out else {}
    if args.json:
        return to_json({"alphas": SPECULATION_ALPHAS, "gammas": SPECULATION_GAMMAS, "speedup": grid, **plot},
                       indent=None)
    text = format_speculation(grid, SPECULATION_ALPHAS, SPECULATION_GAMMAS,
                              f"{args.model} on {args.gpu}, {_workload(args)}, draft {draft}")
    return text + (f"\nplot written to {plot['plot']}" if plot else "")


def _workload(args: argparse.Namespace) -> str:
    """What the grid was evaluated under: a load, a run sent at once, or a fixed batch."""
    if args.concurrency:
        return f"{args.concurrency:,} clients"
    if args.rate:
        return f"{args.rate:g} requests/s"
    return f"{args.num_requests:,} requests at once" if args.num_requests else f"batch {args.batch}"


def _save_speculation_plot(args: argparse.Namespace, grid, draft: str) -> Path:
    from estimator.reporting.plots import plot_speculative_speedup
    return _save_figure(args.out, "--out", args.force, (7, 4.5), lambda ax: plot_speculative_speedup(
        ax, SPECULATION_ALPHAS, SPECULATION_GAMMAS, grid,
        title=f"{args.model} on {args.gpu}, {_workload(args)}, draft: {draft}"))


def _disaggregation(args: argparse.Namespace, db) -> str:
    if not (args.prefill_gpus and args.decode_gpus and args.rate):
        raise ConfigurationError("disaggregated serving needs --prefill-gpus X, --decode-gpus Y and --rate R")
    options = {k: v for k, v in _estimate_kwargs(args).items()
               if k not in ("model", "gpu", "n_gpus", "batch", "concurrency", "rate", "chunked_prefill")}
    result = disagg.compare(args.model, getattr(args, "device", None) or args.gpu, args.rate,
                            args.prefill_gpus, args.decode_gpus,
                            max_devices=args.max_gpus, max_ttft_s=args.max_ttft_s, max_itl_s=args.max_itl_s, db=db,
                            **{**options, "tp": args.tp or 1})
    return to_json(result) if args.json else format_disaggregation(result)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 success, 2 invalid input, 3 unexpected error)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = parse(argv)
    except SystemExit as exc:  # --help (0), or an invalid flag (2): argparse has printed why
        return exc.code if isinstance(exc.code, int) else EXIT_INVALID
    try:
        print(run(args))
    except RooflineError as exc:
        return _fail(args, EXIT_INVALID, str(exc))
    except BrokenPipeError:  # `roofline list gpus | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except KeyboardInterrupt:
        return _fail(args, EXIT_INTERRUPTED, "interrupted")
    except Exception as exc:  # the safety net: a bug, not a bad input
        if args.debug:
            traceback.print_exc()
        hint = "" if args.debug else "; rerun with --debug for the traceback"
        return _fail(args, EXIT_UNEXPECTED, f"unexpected error ({type(exc).__name__}: {str(exc)[:300]}){hint}")
    return EXIT_OK


def _fail(args: argparse.Namespace, code: int, message: str) -> int:
    """Print the message on one line of stderr; return the exit code."""
    print(f"roofline {args.command}: error: {' '.join(message.split())}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
