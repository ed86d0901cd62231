"""`roofline report plan.yaml`: a self-contained procurement document from a plan.

HTML (images embedded as data URIs, no network), Markdown, or PDF where a
converter is installed. The plots are :mod:`estimator.reporting.plots` functions; every
number is re-estimated here from the plan, nothing is typed in.
"""

from __future__ import annotations

import base64
import io
import math
from datetime import date
from importlib import metadata, resources
from pathlib import Path

from estimator.efficiency.engine_profiles import engine as engine_profile
from estimator.efficiency.engine_profiles import load_intervals
from estimator.errors import ConfigurationError, prepare_output, write_atomically
from estimator.evaluation.api import estimate
from estimator.formatting import rate, seconds
from estimator.planning.search import PlanResult, judged_latencies, missed_targets, plan, targeted_latencies
from estimator.planning.spec import PlanSpec
from estimator.reporting.plan_text import describe_targets, tensor_parallel_text, tp_cell
from estimator.serving.lengths import at_means, length_mix
from estimator.specs.database import Database, load_database

SHORTLIST_HEADER = ("hardware", "format", "devices", "tp", "TTFT", "tok/s per user", "tok/s all", "$ per 1M tokens",
                    "tokens per joule")
PERCENTILES = ("p50", "p90", "p99")
MAX_CONCURRENCY = 4096                          # the percentile plot's largest closed-loop load
RATE_SHARES = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)   # of the highest sustainable rate


def _png(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return base64.b64encode(buffer.getvalue()).decode()


def _estimate(spec: PlanSpec, c: dict, db: Database, **changes):
    request = spec.workload.requests[0]
    kwargs = dict(n_gpus=c["count"], tp=c["tp"], ep=c["ep"], attention_dp=c["attention_dp"],
                  weight_format=c["format"], prompt_tokens=request.prompt, output_tokens=request.output,
                  **spec.workload.serving, engine=spec.engine, calibration=None, db=db)
    kwargs.update(changes)
    return estimate(c["model"], c["hardware"], **kwargs)


def _headline(c: dict) -> str:
    return (f"{c['count']} x {c['hardware']}, {c['format']} weights ({tensor_parallel_text(c)}): "
            f"{c['cost_per_million_tokens_usd']:.3f} USD per million output tokens")


def _reasoning(spec: PlanSpec, c: dict, db: Database, role: str) -> str:
    e = _estimate(spec, c, db)
    why = {"memory": "reading weights and KV cache from memory, so memory bandwidth, not FLOP/s, sets its speed",
           "compute": "arithmetic, so tensor-core FLOP/s set its speed",
           "communication": "all-reduces between devices, so a faster interconnect or less tensor parallelism helps",
           "offload": "the host link, so a device with more memory helps most",
           "overhead": "fixed per-step and per-layer costs (kernel launches, all-reduce latency), so fewer, larger "
                       "steps (bigger batches, less tensor parallelism) help most"}[e.decode_bound]
    return (f"{role} It serves the load with TTFT {seconds(c['ttft_s'])} and {rate(c['decode_tps_per_seq'])} "
            f"tokens/s per user ({rate(c['throughput_out_tps'])} tokens/s in all, steady batch {c['batch']:.0f}). "
            f"Decode is {e.decode_bound}-bound: its time goes to {why}. Memory per device: "
            f"{e.memory_required_bytes / 1e9:.0f} of {e.memory_available_bytes / 1e9:.0f} GB."
            + (_at_percentile(spec, c) if spec.targets.latency_percentile else ""))


def _at_percentile(spec: PlanSpec, c: dict) -> str:
    level = spec.targets.latency_percentile
    return (f" The targets apply to the {level} latencies: TTFT {level} {seconds(c[f'ttft_{level}_s'])}, "
            f"ITL {level} {seconds(c[f'itl_{level}_s'])}.")


def percentiles_against_load(spec: PlanSpec, c: dict, db: Database) -> dict:
    """TTFT and ITL p50/p90/p99 of one configuration as the load grows, up to saturation.

    Closed loop: concurrency 1, 2, 4, ... up to the larger of the plan's and the largest batch the KV
    cache holds (at most 4096); open loop: 5-95% of the highest sustainable rate and the plan's rate
    (docs/formulas.md §14). Loads without a steady state (saturated, or not fitting) have no percentiles
    and are left out, not drawn as zero. Returns the ``x`` values kept and a ``series`` per label.
    """
    w = spec.workload
    planned = _estimate(spec, c, db)
    if w.concurrency:
        top = min(max(w.concurrency, int(planned.max_batch)), MAX_CONCURRENCY)
        loads = sorted({*(2 ** k for k in range(top.bit_length()) if 2 ** k <= top), top, w.concurrency})
        runs = [(x, _estimate(spec, c, db, concurrency=x, rate=0.0)) for x in loads]
    else:
        loads = sorted({*(planned.max_rate * share for share in RATE_SHARES), w.rate})
        runs = [(x, _estimate(spec, c, db, rate=x, concurrency=0)) for x in loads]
    columns = [f"{kind}_{p}_s" for kind in ("ttft", "itl") for p in PERCENTILES]
    kept = [(x, e) for x, e in runs
            if e.runnable and all(math.isfinite(e.results.get(k, math.nan)) for k in columns)]
    return {"load": "concurrency" if w.concurrency else "rate", "planned": w.concurrency or w.rate,
            "xlabel": "requests in flight (concurrency)" if w.concurrency else "requests/s arriving",
            "x": [float(x) for x, _ in kept],
            "series": {f"{kind.upper()} {p}": [float(e.results[f"{kind}_{p}_s"]) for _, e in kept]
                       for kind in ("ttft", "itl") for p in PERCENTILES}}


def _percentile_figure(spec: PlanSpec, best: dict, db: Database, plt, plots) -> dict:
    """The figure of :func:`percentiles_against_load` for the recommendation, TTFT beside ITL."""
    data = percentiles_against_load(spec, best, db)
    t = spec.targets
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    logx = data["load"] == "concurrency"
    for ax, kind, target in ((left, "TTFT", t.max_ttft_s),
                             (right, "ITL", 1 / t.min_tps_per_user if t.min_tps_per_user else None)):
        plots.plot_percentiles(ax, data["x"], {k: v for k, v in data["series"].items() if k.startswith(kind)},
                               data["xlabel"], f"{kind} (s)", target=target, planned=data["planned"],
                               title=f"{kind} percentiles against load", logx=logx)
    fig.tight_layout()
    level = t.latency_percentile
    caption = (f"TTFT and inter-token latency at the 50th, 90th and 99th percentiles of the queueing model for "
               f"{best['count']} x {best['hardware']} ({best['format']}, {tensor_parallel_text(best)}) "
               "as the load grows to "
               f"saturation; loads without a steady state are left out. Dashed red: the target (ITL: 1 / tokens/s "
               f"per user), judged on {f'the {level} latencies' if level else 'the means'}; dotted: the planned load.")
    figure = {"png": _png(fig), "caption": caption, "data": data}
    plt.close(fig)
    return figure


def _alternatives(result: PlanResult) -> list[tuple[dict, str]]:
    """Up to two, with their role: the cheapest on other hardware, and the fastest per user on the Pareto front."""
    best = result.configurations[0]
    other = next((c for c in result.configurations if c["hardware"] != best["hardware"]), None)
    fastest = max((c for c in result.configurations if c.get("pareto")),   # per-user speed as the targets judge it
                  key=lambda c: judged_latencies(c, c.get("latency_percentile"))[1])
    picks = [(other, "The cheapest configuration on other hardware."),
             (fastest, "The fastest per user on the cost/speed Pareto front.")]
    seen, out = {id(best)}, []
    for c, role in picks:
        if c is not None and id(c) not in seen:
            seen.add(id(c))
            out.append((c, role))
    return out


def _figures(spec: PlanSpec, result: PlanResult, db: Database) -> list[dict]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from estimator.reporting import plots
    shortlist = result.configurations[:6]
    figures = []

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    devices, points = [], []
    for c in shortlist[:4]:
        e = _estimate(spec, c, db)
        hw = e.hardware
        devices.append((hw.name, hw.peak_flops_per_s(e.compute_dtype), hw.memory_bandwidth_bytes_per_s))
        for phase in ("prefill", "decode"):
            # achieved FLOP/s per device while the phase's kernels run
            busy_s = e.results[f"{phase}_linear_s"] + e.results[f"{phase}_attention_s"]
            per_device = e.results[f"{phase}_flops_total"] / max(busy_s, 1e-12) / c["tp"]
            points.append((f"{phase} {c['count']}x{hw.name.split()[-1]} {c['format']}",
                           e.results[f"{phase}_intensity_flops_per_byte"], per_device))
    plots.plot_roofline(ax, list({d[0]: d for d in devices}.values()), points,
                        title="Roofline: prefill (triangles) and decode (circles) per device")
    figures.append({"png": _png(fig), "caption": "Prefill is compute-bound, decode memory-bound: each point sits "
                    "under its device's roof at the intensity of that phase."})
    plt.close(fig)

    best = result.configurations[0]
    load = [1, 2, 4, 8, 16, 32, 64, 128]
    runs = [(c, r) for c in load if (r := _estimate(spec, best, db, concurrency=c, rate=0.0)).runnable]
    fig, ax = plt.subplots(figsize=(7.5, 4))   # a load that does not run has no speed: left out, not drawn as 0
    plots.plot_lines(ax, [c for c, _ in runs], {"tokens/s per user": [r.decode_tps_per_seq for _, r in runs],
                                                "tokens/s, all users": [r.throughput_out_tps for _, r in runs]},
                     "requests in flight", "tokens/s", title=f"Recommended: {_headline(best)[:60]}",
                     logx=True, logy=True)
    figures.append({"png": _png(fig), "caption": "More concurrency raises aggregate throughput and lowers each "
                    "user's speed; the recommendation's load is where it meets the per-user target."})
    plt.close(fig)
    figures.append(_percentile_figure(spec, best, db, plt, plots))

    prompts = [128, 512, 2048, 8192, 32768]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    series = {}
    for c in [best] + [alt for alt, _ in _alternatives(result)]:
        values = []
        for p in prompts:
            e = _estimate(spec, c, db, prompt_tokens=p, concurrency=1, rate=0.0, lengths=None)
            values.append(e.ttft_s if e.runnable else float("nan"))
        series[f"{c['count']}x {c['hardware']} {c['format']}"] = values
    plots.plot_lines(ax, prompts, series, "prompt tokens", "TTFT (s), one request", logx=True, logy=True,
                     title="TTFT against prompt length")
    figures.append({"png": _png(fig), "caption": "Prefill FLOPs grow with the prompt and attention with its "
                    "square: TTFT bends upward at long prompts."})
    plt.close(fig)

    labels = [f"{c['count']}x{c['hardware'].replace('NVIDIA ', '')[:14]} {c['format']}" for c in shortlist]
    ests = [_estimate(spec, c, db) for c in shortlist]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    plots.plot_memory_breakdown(ax, labels, {
        "weights": [e.memory_weights_bytes for e in ests], "KV cache": [e.memory_kv_cache_bytes for e in ests],
        "activations": [e.memory_activation_bytes for e in ests], "reserve": [e.memory_reserve_bytes for e in ests]},
        [e.memory_available_bytes for e in ests], title="Memory per device at the planned load")
    fig.tight_layout()
    figures.append({"png": _png(fig), "caption": "Weights (all experts for MoE) plus the KV cache of every "
                    "sequence in flight must fit beside the runtime reserve."})
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7.5, 4))
    plots.plot_costs(ax, labels, [c["cost_per_million_tokens_usd"] for c in shortlist],
                     title="Cost per million output tokens")
    fig.tight_layout()
    figures.append({"png": _png(fig), "caption": "Devices x price per device-hour over output tokens per hour."})
    plt.close(fig)
    return figures


def _sensitivity(spec: PlanSpec, result: PlanResult, db: Database) -> list[tuple]:
    best = result.configurations[0]
    slow = engine_profile(spec.engine)
    params = slow.parameters
    slower = slow.model_copy(update={"parameters": params.model_copy(update={
        "bandwidth_eff": {k: v * 0.8 for k, v in params.bandwidth_eff.items()},
        "kv_bandwidth_eff": params.kv_bandwidth_eff * 0.8})})
    cases = [("as planned", {}), ("bandwidth efficiency 20% lower", {"engine": slower}),
             ("prompts twice as long", _longer_prompts(spec.workload)),
             ("speculative decoding, acceptance 0.8", {"draft_cost": 0.05, "draft_tokens": 4, "acceptance": 0.8}),
             ("speculative decoding, acceptance 0.5", {"draft_cost": 0.05, "draft_tokens": 4, "acceptance": 0.5})]
    rows = []
    hourly = best["cost_per_hour_usd"]
    for label, change in cases:
        if change is None:
            rows.append((label, "-", "-", "-", "not computed: a lengths file's prompts are as measured"))
            continue
        e = _estimate(spec, best, db, **change)
        if not e.runnable:
            rows.append((label, "-", "-", "-", "no: " + ("; ".join(e.warnings) or "does not fit")))
            continue
        ttft, tps = targeted_latencies(spec, e.model.shape.moe, e.hardware, e.weight_format.name,   # as the plan
                                       e.serving.single_client, e.results)
        ok = not missed_targets(spec, ttft, tps)[0]
        rows.append((label, seconds(ttft), rate(tps),
                     f"{hourly / (e.throughput_out_tps * 3600) * 1e6:.3f}", "yes" if ok else "no"))
    return rows


def _longer_prompts(w) -> dict | None:
    """The change that makes prompts twice as long: the first request type's, or a preset length mix at twice its mean
    prompt; None for a file of requests."""
    if not w.lengths:
        return {"prompt_tokens": 2 * w.requests[0].prompt}
    mix = length_mix(w.lengths)
    longer = at_means(w.lengths, 2 * mix.mean_prompt_tokens, mix.mean_output_tokens)
    return {"lengths": longer} if longer else None


def _sensitivity_header(spec: PlanSpec) -> tuple[str, ...]:
    level = spec.targets.latency_percentile
    return ("if ...", f"TTFT {level}" if level else "TTFT",
            f"tokens/s per user (1/ITL {level})" if level else "tokens/s per user", "$ per 1M tokens", "meets targets")


def _shortlist(spec: PlanSpec, result: PlanResult) -> tuple[tuple, list[tuple]]:
    """The shortlist's header and rows; with a latency percentile, its TTFT and ITL beside the means."""
    level = spec.targets.latency_percentile
    extra = (f"TTFT {level}", f"ITL {level}") if level else ()
    rows = [(c["hardware"], c["format"], c["count"], tp_cell(c), seconds(c["ttft_s"]), rate(c["decode_tps_per_seq"]),
             *((seconds(c[f"ttft_{level}_s"]), seconds(c[f"itl_{level}_s"])) if level else ()),
             rate(c["throughput_out_tps"]), f"{c['cost_per_million_tokens_usd']:.3f}",
             f"{c['tokens_per_joule']:.2f}" if c.get("tokens_per_joule") else "-")
            for c in result.configurations[:12]]
    return SHORTLIST_HEADER[:6] + extra + SHORTLIST_HEADER[6:], rows


def build_context(spec: PlanSpec, result: PlanResult, db: Database, plan_name: str) -> dict:
    """Everything the report templates show."""
    shortlist_header, shortlist = _shortlist(spec, result)
    context = {
        "title": f"Inference hardware plan: {', '.join(spec.models)}", "date": date.today().isoformat(),
        "version": _version(), "plan_name": plan_name,
        "requirements": [describe_targets(spec), f"constraints: {spec.constraints.model_dump(exclude_none=True)}",
                         f"prices: energy {spec.prices.energy_usd_per_kwh} USD/kWh, utilization "
                         f"{spec.prices.utilization:.0%}, PUE {spec.prices.pue}, amortization "
                         f"{spec.prices.amortization_years:g} years"],
        "shortlist_header": shortlist_header, "shortlist": shortlist,
        "sensitivity_header": _sensitivity_header(spec),
        "rejected_summary": f"{len(result.rejected)} candidates rejected: "
                            + "; ".join(sorted({r['reason'].split(':')[0] for r in result.rejected})),
        "prices": [p for p in result.prices if any(c["hardware"] == p["hardware"] for c in result.configurations)],
        "assumptions": _assumptions(spec), "accuracy": _accuracy(),
        "recommendation": None, "alternatives": [], "figures": [], "sensitivity": [], "closest_miss": "",
    }
    if result.configurations:
        best = result.configurations[0]
        context["recommendation"] = {"headline": _headline(best), "reasoning": _reasoning(
            spec, best, db, "The cheapest configuration that meets every target.")}
        context["alternatives"] = [{"headline": _headline(c), "reasoning": _reasoning(spec, c, db, role)}
                                   for c, role in _alternatives(result)]
        context["figures"] = _figures(spec, result, db)
        context["sensitivity"] = _sensitivity(spec, result, db)
    elif result.closest_miss:
        c = result.closest_miss
        context["closest_miss"] = f"Closest miss: {c['count']} x {c['hardware']} ({c['format']}): {c['reason']}."
    return context


def _assumptions(spec: PlanSpec) -> list[str]:
    profile = engine_profile(spec.engine)
    fit = profile.fit
    return [
        f"Engine profile {profile.name}: " + (f"fitted on {fit.dataset_rows} published measurements from "
                                              f"{len(fit.sources)} source(s) ({fit.date})" if fit else
                                              "prior efficiencies, not fitted to measurements"),
        "Efficiencies: datasheet peaks x default device efficiencies (no calibration profile applied in reports)",
        "Decode: continuous batching at the planned load (Little's law), the prompts' cost included; TTFT includes "
        "queueing; KV cache paged in 16-token blocks, f16",
        "Layouts: tensor parallelism within a node, further devices as data-parallel replicas",
        "MoE: uniform expert routing (an upper bound on experts read per step)",
    ]


def _accuracy() -> str:
    stored = load_intervals()
    if stored is None:
        return "No validation results are shipped with this installation."
    h = stored["headline"]
    return (f"Cross-validated against {h['rows']} published measurements from {h['sources']} sources (each source "
            f"predicted by parameters fitted without it), the median absolute error is "
            f"{h['decode_median_abs_error']:.0%} for decode speed and {h['prefill_ttft_median_abs_error']:.0%} for "
            f"prefill and TTFT. Estimates carry 80% intervals that covered {stored['out_of_source_coverage']:.0%} "
            "of rows from sources the fit never saw.")


def _version() -> str:
    try:
        return metadata.version("llm-roofline")
    except metadata.PackageNotFoundError:
        return "(source tree)"


def render_html(context: dict) -> str:
    import jinja2
    template = resources.files("estimator.reporting").joinpath("templates/report.html.j2").read_text()
    return jinja2.Environment(autoescape=True).from_string(template).render(**context)


def render_markdown(context: dict) -> str:
    lines = [f"# {context['title']}", "", f"_Generated {context['date']} from {context['plan_name']}._", "",
             "## Requirements", *[f"- {x}" for x in context["requirements"]], "", "## Recommendation"]
    if context["recommendation"]:
        r = context["recommendation"]
        lines += [f"**{r['headline']}**", "", r["reasoning"], "", "### Alternatives",
                  *[f"- **{a['headline']}**: {a['reasoning']}" for a in context["alternatives"]]]
    else:
        lines += ["**No configuration meets the targets.** " + context["closest_miss"]]
    lines += ["", "## Shortlist", "| " + " | ".join(context["shortlist_header"]) + " |",
              "|" + "---|" * len(context["shortlist_header"]),
              *["| " + " | ".join(map(str, row)) + " |" for row in context["shortlist"]], "", context["rejected_summary"],
              "", "## Plots", *[f"![{f['caption']}](data:image/png;base64,{f['png']})\n\n_{f['caption']}_"
                                for f in context["figures"]],
              "", "## Sensitivity", "| " + " | ".join(context["sensitivity_header"]) + " |",
              "|---|---|---|---|---|", *["| " + " | ".join(map(str, row)) + " |" for row in context["sensitivity"]],
              "", "## Assumptions and sources", *[f"- {x}" for x in context["assumptions"]],
              *[f"- price: {p['hardware']} {p['usd_per_device_hour']:.3f} USD/device-hour, {p['source']}"
                for p in context["prices"]], "", "## Accuracy", context["accuracy"]]
    return "\n".join(lines) + "\n"


def write_report(plan_path: str, out: str, fmt: str = "html", force: bool = False, db: Database | None = None) -> str:
    """Plan, build the report, write it (never over an existing file without ``force``)."""
    from estimator.planning.spec import load_plan
    db = db or load_database()
    spec = load_plan(plan_path)
    prepare_output(out, force, "--out")
    to_pdf = _pdf_converter() if fmt == "pdf" else None   # a missing converter fails before the work, not after
    context = build_context(spec, plan(spec, db), db, Path(plan_path).name)
    document = render_markdown(context) if fmt == "md" else render_html(context)

    def write(path: Path) -> None:
        if to_pdf:
            to_pdf(document, path)
        else:
            path.write_text(document, encoding="utf-8")

    return f"report written to {write_atomically(out, write, force, '--out')}"


def _pdf_converter():
    """A function that writes HTML as a PDF file; an error naming the install command if there is none."""
    try:
        import weasyprint
    except ImportError:
        raise ConfigurationError("PDF needs a converter: pip install weasyprint (or write --format html and print "
                                 "it from a browser)") from None
    return lambda html, path: weasyprint.HTML(string=html).write_pdf(str(path))
