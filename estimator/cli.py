"""The `roofline` command line: parse, load specs, call the library, format, print.

Errors a user can cause are caught once, printed as ``Name: message``, and the
command exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from estimator.errors import ConfigurationError, RooflineError, describe_validation_error
from estimator.evaluation.api import estimate, speculative_speedup_grid
from estimator.formatting import table
from estimator.planning import disaggregation as disagg
from estimator.reporting import catalog
from estimator.reporting.estimate_text import format_disaggregation, format_estimate
from estimator.reporting.explain import explain
from estimator.specs.database import load_database
from estimator.validation import predict


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", action="append", default=[], metavar="PATH",
                   help="folder of extra hardware/model YAML entries (repeatable; also $ROOFLINE_DB_PATH)")


def _add_estimate_args(p: argparse.ArgumentParser) -> None:
    """The configuration flags `estimate` and `explain` share."""
    p.add_argument("--model", required=True, help="name, alias, HF id, or path to a config.json")
    p.add_argument("--gpu", required=True, help="name, alias or NVML name (see `roofline list gpus`)")
    p.add_argument("--gpus", type=int, help="devices in all (default tp x pp); beyond one replica: data parallel")
    p.add_argument("--tp", type=int, help="tensor-parallel ranks per replica (default: all --gpus / pp)")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages per replica (default 1)")
    p.add_argument("--ep", type=int, default=1, help="expert-parallel ranks within the TP group, MoE only (default 1)")
    p.add_argument("--devices-per-node", type=int, default=8,
                   help="devices on one scale-up link (NVLink domain); beyond it the network is used (default 8)")
    p.add_argument("--network-gbps", type=float, default=400.0,
                   help="scale-out network per device between nodes, Gbit/s one way (default 400: InfiniBand NDR)")
    p.add_argument("--format", default="bf16", help="weight format (default bf16; `roofline list formats`)")
    p.add_argument("--kv-format", default="f16", help="KV-cache format: f16, bf16, fp8, int8, q4 (default f16)")
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences (default 1)")
    p.add_argument("--prompt", type=int, default=512, help="prompt tokens per sequence (default 512)")
    p.add_argument("--output", type=int, default=256, help="generated tokens per sequence (default 256)")
    p.add_argument("--attention", choices=("fused", "unfused"), default="fused",
                   help="fused (FlashAttention-style, default) or unfused attention that writes the score matrix")
    p.add_argument("--kv-alloc", choices=("paged", "contiguous"), default="paged",
                   help="paged KV blocks (default) or contiguous per-request reservation")
    p.add_argument("--kv-block", type=int, default=16, help="tokens per paged KV block (default 16)")
    p.add_argument("--prefix-tokens", type=int, default=0,
                   help="prompt prefix shared by all requests (e.g. a system prompt), cached once (default 0)")
    p.add_argument("--offload", choices=("none", "auto"), default="none",
                   help="auto: weights that do not fit stream from host memory over PCIe/NVLink-C2C (default none)")
    p.add_argument("--gpu-layers", type=int, help="llama.cpp-style partial offload: N layers on the GPU, "
                                                  "the rest computed by the host CPU (--host-cpu)")
    p.add_argument("--host-cpu", default="AMD Ryzen 9 7950X", help="host CPU for --gpu-layers (default 7950X)")
    p.add_argument("--draft-model", help="speculative decoding: draft model (name, alias or config.json)")
    p.add_argument("--draft-tokens", type=int, default=0, help="speculative decoding: tokens drafted per step, γ")
    p.add_argument("--acceptance", type=float, default=0.7, help="per-token draft acceptance rate α (default 0.7)")
    p.add_argument("--draft-cost", type=float, default=0.0,
                   help="without --draft-model: draft cost as a fraction of a target step (EAGLE ~0.05)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=0,
                      help="steady state with C requests in flight (continuous batching; replaces --batch)")
    load.add_argument("--rate", type=float, default=0.0, help="steady state at R requests/s arriving (open loop)")
    p.add_argument("--chunked-prefill", type=int, default=0, metavar="TOKENS",
                   help="under load: mix prompt chunks into decode steps within this token budget per step")
    p.add_argument("--prefill-gpus", type=int, help="with --rate: disaggregated serving, X devices prefilling ...")
    p.add_argument("--decode-gpus", type=int, help="... and Y devices decoding; compared with aggregated on X + Y")
    p.add_argument("--max-ttft-s", type=float, help="with --prefill-gpus: TTFT target for the fewest-devices search")
    p.add_argument("--max-itl-s", type=float, help="with --prefill-gpus: inter-token latency target")
    p.add_argument("--max-gpus", type=int, default=64, help="largest deployment the search tries (default 64)")
    p.add_argument("--engine", default="generic",
                   help="serving engine profile: llama.cpp, vLLM, SGLang, TensorRT-LLM, transformers, MLX, "
                        "ExLlamaV2, gpt-fast or generic (default)")
    p.add_argument("--calibration", default="auto",
                   help="calibration profile (YAML from `roofline calibrate`); 'auto' (default) uses the newest "
                        "profile of this device in the calibration folder, 'none' the datasheet defaults")
    p.add_argument("--json", action="store_true", help="print one JSON object (base units: s, bytes)")
    _add_db(p)


def _estimate_kwargs(args: argparse.Namespace) -> dict:
    """The flags as keyword arguments of :func:`estimator.evaluation.api.estimate`."""
    return dict(
        model=args.model, gpu=args.gpu, n_gpus=args.gpus, tp=args.tp, pp=args.pp, ep=args.ep,
        devices_per_node=args.devices_per_node, network_gbps=args.network_gbps,
        weight_format=args.format, kv_format=args.kv_format, batch=args.batch, prompt_tokens=args.prompt,
        output_tokens=args.output, kv_alloc=args.kv_alloc, kv_block_tokens=args.kv_block,
        prefix_tokens=args.prefix_tokens, attention=args.attention, offload=args.offload,
        gpu_layers=args.gpu_layers, host_cpu=args.host_cpu, draft_model=args.draft_model,
        draft_tokens=args.draft_tokens, acceptance=args.acceptance, draft_cost=args.draft_cost,
        concurrency=args.concurrency, rate=args.rate, chunked_prefill=args.chunked_prefill,
        calibration=None if args.calibration == "none" else args.calibration, engine=args.engine)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roofline", description="How fast will this LLM run on that GPU? Roofline estimates of TTFT, "
                                     "decode tokens/s and memory fit.")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_estimate_args(sub.add_parser("estimate", help="estimate one configuration"))
    _add_estimate_args(sub.add_parser(
        "explain", help="why a configuration runs at that speed, and the changes that would help most"))

    spec = sub.add_parser("speculation", help="speculative-decoding speed-up over acceptance rate and draft length")
    _add_estimate_args(spec)
    spec.add_argument("--out", help="write the plot to this PNG file (never over an existing file without --force)")
    spec.add_argument("--force", action="store_true", help="overwrite --out if it exists")

    cal = sub.add_parser("calibrate", help="measure this machine's device and write a calibration profile")
    cal.add_argument("--device", default="cpu", help="cuda, cpu or mps (default cpu)")
    mode = cal.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick", help="well under a minute (default)")
    mode.add_argument("--full", dest="mode", action="store_const", const="full", help="a few minutes, more sizes")
    mode.add_argument("--smoke", dest="mode", action="store_const", const="smoke",
                      help="the smallest plan, a few seconds: checks the setup, not for estimates")
    cal.add_argument("--out", help="profile path (default: the calibration folder, named after the device)")
    cal.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    cal.add_argument("--compare", nargs=2, metavar=("A.yaml", "B.yaml"), help="compare two profiles instead")
    _add_db(cal)

    pl = sub.add_parser("plan", help="which hardware, how many, in which format, at what cost (or a plan.yaml)")
    pl.add_argument("plan_file", nargs="?", help="a plan YAML (keys mirror the flags); flags are then ignored")
    pl.add_argument("--model", action="append", help="model(s) to plan for (repeatable)")
    pl.add_argument("--prompt", type=int, help="prompt tokens per request")
    pl.add_argument("--output", type=int, help="output tokens per request")
    load = pl.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=0, help="requests in flight")
    load.add_argument("--rate", type=float, default=0.0, help="requests per second")
    pl.add_argument("--max-ttft-s", type=float, help="TTFT target, seconds, queueing included")
    pl.add_argument("--min-tps-per-user", type=float, help="decode tokens/s per user target")
    pl.add_argument("--percentile", choices=("p50", "p90"), default="p50",
                    help="p90: judge the pessimistic end of each estimate's 80%% interval")
    fmts = pl.add_mutually_exclusive_group()
    fmts.add_argument("--formats", help="comma-separated weight formats to consider (default bf16,fp8,int4-awq,nvfp4)")
    fmts.add_argument("--min-bits", type=float, help="only formats with at least this many bits per weight")
    pl.add_argument("--gpus", help="comma-separated devices or classes (datacenter_gpu, consumer_gpu ...)")
    pl.add_argument("--max-gpus", type=int, default=8, help="largest deployment to consider (default 8)")
    pl.add_argument("--on-prem", action="store_true", help="purchase + power instead of cloud hourly prices")
    pl.add_argument("--budget", type=float, help="USD: purchase (on-prem) or per month (cloud)")
    pl.add_argument("--engine", default="vLLM", help="serving-engine profile (default vLLM)")
    pl.add_argument("--price", action="append", default=[], metavar="DEVICE=USD",
                    help="override a price: USD per device-hour (cloud) or purchase USD (--on-prem); repeatable")
    pl.add_argument("--devices-per-node", type=int, default=8, help="devices per node / NVLink domain (default 8)")
    pl.add_argument("--json", action="store_true")
    _add_db(pl)

    rep = sub.add_parser("report", help="a self-contained procurement report (HTML, Markdown or PDF) from a plan")
    rep.add_argument("plan_file", help="plan YAML (see `roofline plan`)")
    rep.add_argument("--out", required=True, help="output file")
    rep.add_argument("--format", choices=("html", "md", "pdf"), default="html")
    rep.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    _add_db(rep)

    val = sub.add_parser("validate", help="the estimator's error against published measurements (or this machine)")
    source = val.add_mutually_exclusive_group(required=True)
    source.add_argument("--published", action="store_true", help="leave-one-source-out error on measurements_db")
    source.add_argument("--local", action="store_true", help="measure a real model on this machine and compare")
    val.add_argument("--write", metavar="ENGINES_DIR",
                     help="--published: write the fitted engine parameters and intervals into this engines_db folder")
    val.add_argument("--plot", help="--published: write the predicted-vs-measured scatter to this PNG")
    val.add_argument("--device", default="cpu", help="--local: cpu, cuda or mps (default cpu)")
    val.add_argument("--model", action="append", help="--local: model(s) to build (default: a small one)")
    val.add_argument("--quick", action="store_true", help="--local: one small model, few sizes (CI)")
    val.add_argument("--force", action="store_true", help="overwrite --plot if it exists")
    val.add_argument("--json", action="store_true")
    _add_db(val)

    lst = sub.add_parser("list", help="list gpus, models or formats")
    lst.add_argument("what", choices=("gpus", "models", "formats"))
    lst.add_argument("--vendor", help="gpus: only this vendor (e.g. NVIDIA, AMD, Apple)")
    lst.add_argument("--class", dest="device_class", help="gpus: datacenter_gpu, consumer_gpu, soc_unified, ...")
    lst.add_argument("--family", help="models: only this family (e.g. llama, qwen)")
    lst.add_argument("--min-memory-gib", type=float, help="gpus: at least this much memory")
    lst.add_argument("--moe", action="store_true", help="models: only mixture-of-experts models")
    lst.add_argument("--json", action="store_true")
    _add_db(lst)

    show = sub.add_parser("show", help="every field of a gpu or model, with its source")
    show.add_argument("what", choices=("gpu", "model"))
    show.add_argument("name")
    show.add_argument("--json", action="store_true")
    _add_db(show)

    chk = sub.add_parser("check", help="validate the databases (built-in and --db) and compare parameter counts")
    _add_db(chk)

    pred = sub.add_parser("predict", help="predict each configuration of a CSV")
    pred.add_argument("--csv", required=True, help="input CSV (id, framework, hardware, n_gpus, model, "
                                                   "weight_format, kv_format, batch, input_len, output_len, metric"
                                                   "[, value, unit])")
    pred.add_argument("--out", required=True, help="output CSV (id, status, predicted, measured, rel_error, reason)")
    pred.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    _add_db(pred)
    return parser


def run(args: argparse.Namespace) -> str:
    """Execute a parsed command and return what to print."""
    db = load_database(args.db)
    if args.command == "estimate" and (args.prefill_gpus or args.decode_gpus):
        return _disaggregation(args, db)
    if args.command == "estimate":
        e = estimate(**_estimate_kwargs(args), db=db)
        return json.dumps(e.to_dict(), indent=2) if args.json else format_estimate(e)
    if args.command == "explain":
        return explain(_estimate_kwargs(args), db=db, as_json=args.json)
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
        from calibrate.run import calibrate, stderr_progress, tiny_plan
        from calibrate.summary import compare, format_profile
    except ImportError as exc:
        raise ConfigurationError(str(exc)) from None
    if args.compare:
        return compare(*(load_profile(p) for p in args.compare))
    plan = tiny_plan(args.device) if args.mode == "smoke" else None
    profile = calibrate(args.device, "quick" if args.mode in (None, "smoke") else args.mode, plan=plan, db=db,
                        progress=stderr_progress)
    out = save_profile(profile, args.out or default_profile_path(profile.device.name), force=args.force or not args.out)
    hardware = db.hardware.get(profile.device.matched_hardware) if profile.device.matched_hardware else None
    return format_profile(profile, hardware) + f"\nprofile written to {out}"


def plan_from_args(args: argparse.Namespace):
    """A PlanSpec from a plan file, or from the flags (the same keys)."""
    from pydantic import ValidationError

    from estimator.planning.spec import PlanSpec, load_plan
    if args.plan_file:
        return load_plan(args.plan_file)
    if not args.model:
        raise ConfigurationError("give a plan file, or --model with --prompt, --output and --concurrency or --rate")
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()] if text else None  # noqa: E731
    try:
        return PlanSpec(
            models=args.model, engine=args.engine,
            workload={"prompt": args.prompt, "output": args.output, "concurrency": args.concurrency,
                      "rate": args.rate},
            targets={"max_ttft_s": args.max_ttft_s, "min_tps_per_user": args.min_tps_per_user,
                     "percentile": args.percentile},
            constraints={"formats": split(args.formats), "min_bits": args.min_bits, "gpus": split(args.gpus),
                         "max_gpus": args.max_gpus, "deployment": "on_prem" if args.on_prem else "cloud",
                         "budget_usd": args.budget, "devices_per_node": args.devices_per_node},
            prices={"devices": _price_overrides(args.price, args.on_prem)})
    except ValidationError as exc:
        raise ConfigurationError(describe_validation_error(exc)) from None


def _price_overrides(items: list[str], on_prem: bool) -> dict:
    out = {}
    for item in items:
        name, _, value = item.rpartition("=")
        try:
            amount = float(value)
        except ValueError:
            raise ConfigurationError(f"--price {item!r}: expected DEVICE=USD, e.g. 'NVIDIA H100 SXM=2.99'") from None
        out[name.strip()] = {"purchase_usd" if on_prem else "cloud_usd_per_hour": amount}
    return out


def _plan(args: argparse.Namespace, db) -> str:
    from estimator.planning.search import plan
    from estimator.reporting.plan_text import format_plan
    result = plan(plan_from_args(args), db=db)
    if args.json:
        return json.dumps(result.to_dict(), indent=2, default=lambda x: None)
    return format_plan(result)


def _validate(args: argparse.Namespace, db) -> str:
    if args.local:
        from estimator.validation.local import validate_local
        return validate_local(args.device, args.model, quick=args.quick, db=db, as_json=args.json)
    from estimator.validation import published as val
    try:
        result = val.run(db=db)
    except ImportError as exc:
        raise ConfigurationError(f"fitting needs scipy: pip install scipy ({exc})") from None
    text = json.dumps({"headline": val.headline(result), "widening": val.calibrated_widening(result)[0],
                       **{f"by_{by.replace(' ', '_')}": val.error_table(result, by)
                          for by in ("metric", "engine", "device class", "model type")}}, indent=2) \
        if args.json else val.format_validation(result)
    if args.plot:
        text += "\n" + _save_validation_plot(result, args)
    if args.write:
        text += "\nwrote " + ", ".join(val.write_results(result, args.write))
    return text


def _save_figure(path: str, flag: str, force: bool, size: tuple[float, float], draw) -> str:
    """Draw on a new figure with ``draw(ax)`` and save it as PNG, never over an existing file without --force."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(path)
    if out.exists() and not force:
        raise ConfigurationError(f"{out} exists; pass --force to overwrite it, or choose another {flag}")
    fig, ax = plt.subplots(figsize=size)
    draw(ax)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return f"plot written to {out}"


def _save_validation_plot(result, args) -> str:
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
    if args.json:
        return json.dumps({"alphas": SPECULATION_ALPHAS, "gammas": SPECULATION_GAMMAS, "speedup": grid.tolist()})
    rows = [(f"γ = {g}", *(f"{v:.2f}" for v in row)) for g, row in zip(SPECULATION_GAMMAS, grid)]
    draft = kwargs["draft_model"] or f"heads at {kwargs['draft_cost']:g} of a step"
    text = (f"Speculative decoding speed-up, {args.model} on {args.gpu}, batch {args.batch}, draft {draft}\n"
            + table(rows, header=("", *(f"α={a:g}" for a in SPECULATION_ALPHAS))))
    if args.out:
        text += "\n" + _save_speculation_plot(args, grid, draft)
    return text


def _save_speculation_plot(args: argparse.Namespace, grid, draft: str) -> str:
    from estimator.reporting.plots import plot_speculative_speedup
    return _save_figure(args.out, "--out", args.force, (7, 4.5), lambda ax: plot_speculative_speedup(
        ax, SPECULATION_ALPHAS, SPECULATION_GAMMAS, grid,
        title=f"{args.model} on {args.gpu}, batch {args.batch}, draft: {draft}"))


def _disaggregation(args: argparse.Namespace, db) -> str:
    if not (args.prefill_gpus and args.decode_gpus and args.rate):
        raise ConfigurationError("disaggregated serving needs --prefill-gpus X, --decode-gpus Y and --rate R")
    common = dict(tp=args.tp or 1, pp=args.pp, ep=args.ep, weight_format=args.format, kv_format=args.kv_format,
                  prompt_tokens=args.prompt, output_tokens=args.output, db=db)
    result = {
        "rate": args.rate,
        "disaggregated": disagg.disaggregated(args.model, args.gpu, args.rate, args.prefill_gpus, args.decode_gpus,
                                              **common),
        "aggregated": disagg.aggregated(args.model, args.gpu, args.rate, args.prefill_gpus + args.decode_gpus,
                                        **common),
    }
    if args.max_ttft_s or args.max_itl_s:
        result["fewest_devices"] = disagg.fewest_devices(args.model, args.gpu, args.rate, max_devices=args.max_gpus,
                                                         max_ttft_s=args.max_ttft_s, max_itl_s=args.max_itl_s,
                                                         **common)
        result["targets"] = {"max_ttft_s": args.max_ttft_s, "max_itl_s": args.max_itl_s}
    return json.dumps(result, indent=2) if args.json else format_disaggregation(result)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        print(run(args))
    except RooflineError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `roofline list gpus | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
