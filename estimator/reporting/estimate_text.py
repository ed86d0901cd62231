"""Plain-text reports: formatters return strings, the CLI prints them.

Metric definitions are printed with the numbers, since mismatched definitions
(TTFT with or without queueing, TPOT with or without the first token) are the
most common source of "wrong number" reports (docs/formulas.md §11, §12.9).
"""

from __future__ import annotations

import math
from typing import Iterable

from estimator.efficiency.defaults import memory_utilization
from estimator.evaluation.api import Estimate
from estimator.evaluation.columns import FALLBACK_LINK_BYTES_PER_S
from estimator.evaluation.intervals import band_remark
from estimator.formatting import NOT_AVAILABLE, gigabytes, rate, seconds, table
from estimator.reporting.measured import format_measured
from estimator.reporting.verify import format_verify
from estimator.units import GB, TB, TFLOPS

DEFINITIONS = (
    "TTFT: time to first token = prefill of the whole batch's prompts; excludes queueing, tokenization and network. "
    "Under a load (--concurrency/--rate) it is per request and includes the wait for prefill (an M/G/1 queue, "
    "M/D/1 when every request has the same lengths) and for a free slot when more requests are in flight than "
    "the engine runs.",
    "ITL (inter-token latency) = TPOT exclusive of the first token = (E2E - TTFT) / (output - 1), "
    "averaged over the generation as the KV cache grows from prompt to prompt + output.",
    "TPOT inclusive = E2E / output tokens (the GuideLLM convention).",
    "Decode tokens/s per sequence = 1 / ITL; whole batch = batch / ITL. E2E = TTFT + (output - 1) x ITL.",
    "Memory is per device; GB = 10^9 bytes, GiB = 2^30 bytes.",
    "Percentiles under a load: one engine, prefill before decode steps, Poisson arrivals (M/G/1 wait with an "
    "exponential tail), request lengths fixed or from --lengths (a request's own prefill and output at their "
    "quantile), E2E p99 by a normal approximation (docs/formulas.md §14).",
)
# The byte terms only some engines' code pays (eager engines, ExLlamaV2's copies), each defined where the estimate
# shows it.
ENGINE_BYTE_TERMS = {"kv_expand": "kv expand = the KV cache copied before attention reads it (grouped heads out to "
                                  "one per query head, a quantized cache widened to 16 bits)",
                     "elementwise": "elementwise = a pass of its own for each unfused elementwise op",
                     "score_ops": "score ops = unfused attention's softmax (and soft-cap) passes over the scores, "
                                  "kernels of their own beside its matmuls"}


def _host_link(hw) -> str:
    link = hw.host_link
    return f"no host link published; {FALLBACK_LINK_BYTES_PER_S / GB:.0f} GB/s assumed" if link is None else \
        f"{link.kind}, {link.bandwidth.base / GB:.0f} GB/s each way"


def running_batch(e: Estimate) -> float:
    """The sequences the engine runs: the steady batch under a load, the running batch of a run, else the batch."""
    return e.results.get("steady_batch", e.results.get("running_batch", e.batch))


def _bound_line(e: Estimate, phase: str) -> str:
    r = e.results
    bound = r[f"{phase}_bound"]
    intensity = r[f"{phase}_intensity_flops_per_byte"]
    ridge = r["ridge_flops_per_byte"]
    if bound == "offload":
        why = (f"the offloaded part (host link or host CPU) takes {seconds(r[f'{phase}_offload_s'])} of its "
               f"{seconds(r[f'{phase}_linear_s'] + r[f'{phase}_attention_s'] + r[f'{phase}_offload_s'])}")
        if phase == "decode":
            why += f"; with everything on the device it would decode {r['offload_slowdown']:.1f}x faster"
    elif bound == "overhead":
        fixed = r[f"{phase}_overhead_s"] + r[f"{phase}_communication_s"]
        why = (f"fixed per-step and per-layer costs and all-reduces ({seconds(fixed)}) exceed the roofline "
               f"time ({seconds(r[f'{phase}_linear_s'] + r[f'{phase}_attention_s'])})")
        blocking_s = e.engine_profile.parameters.blocking_output_per_sequence_s
        if e.engine_profile.parameters.eager_host:
            why += (" (eager PyTorch: the host launches every op from Python, and the device waits for it; "
                    "docs/formulas.md §13)")
        elif phase == "decode" and blocking_s > 0:
            per_replica = running_batch(e) / e.layout.dp
            why += (f"; {seconds(blocking_s * per_replica)} of it is processing the step's outputs before the next "
                    f"step is scheduled, as {e.engine_profile.name} does (docs/formulas.md §14)")
        elif phase == "prefill" and r["prefill_launch_excess_s"] > 0:
            graphed = e.engine_profile.parameters.graphed_prefill_tokens
            replays = "for decode steps only" if graphed == 0 else f"only for steps of up to {graphed} tokens"
            why += (f"; {seconds(r['prefill_launch_excess_s'])} of it is launching the prompt pass from Python, "
                    f"as {e.engine_profile.name} replays CUDA graphs {replays} (docs/formulas.md §14)")
    else:
        side = ">" if intensity > ridge else "<"
        why = f"intensity {intensity:,.1f} FLOP/byte {side} ridge point {ridge:,.0f} FLOP/byte"
        if bound == "compute" and intensity <= ridge:   # the time counts work the intensity's FLOPs do not
            why += (" (compute-bound below the ridge: its MoE expert GEMMs run over few tokens each, padded to "
                    "their row tiles, docs/formulas.md §9)" if e.model.shape.moe is not None else
                    " (compute-bound below the ridge: the engine reaches a smaller share of the dense peak than of "
                    "the bandwidth)")
        elif bound == "memory" and intensity > ridge:
            why += " (memory-bound above the ridge: attention's KV-cache reads outweigh the compute-bound matmuls)"
    line = f"{_phase_names(running_batch(e))[phase == 'decode']}: {bound}-bound, {why}"
    if phase == "decode" and bound == "memory":
        per_sm = float(r.get("weights_per_sm_bound_bytes_per_s", math.nan))
        if math.isfinite(per_sm):
            sms = e.hardware.streaming_multiprocessors.value
            line += (f"; its weights stream at {_bandwidth_text(per_sm)}, {sms:.0f} SMs at "
                     f"{e.engine_profile.parameters.native_bytes_per_s_per_sm / GB:.1f} GB/s each, as "
                     f"{e.engine_profile.name}'s 16-bit mat-vecs keep few bytes in flight per SM "
                     "(docs/formulas.md §9)")
        line += f"; its matmuls turn compute-bound near batch {r['critical_batch']:,.0f}"
    if phase == "decode":
        crossover = r["kv_crossover_tokens"]
        line += ("; sliding windows cap the KV reads, so weights dominate at any context" if crossover == float("inf")
                 else f"; KV-cache reads overtake weight reads past {crossover:,.0f} tokens of context")
    return line


def _bandwidth_text(bytes_per_s: float) -> str:
    return f"{bytes_per_s / TB:.2f} TB/s" if bytes_per_s >= 0.5 * TB else f"{bytes_per_s / GB:.1f} GB/s"


def _flops_text(flops_per_s: float) -> str:
    return f"{flops_per_s / TFLOPS:,.0f} TFLOPS" if flops_per_s >= 10 * TFLOPS else f"{flops_per_s / 1e9:,.0f} GFLOPS"


def _layout_text(layout) -> str:
    parts = [f"tensor-parallel {layout.tp}" + (" with attention data-parallel" if layout.attention_dp else "")]
    if layout.pp > 1:
        parts.append(f"{layout.pp} pipeline stages")
    if layout.ep > 1:
        parts.append(f"expert-parallel {layout.ep}")
    if layout.dp > 1:
        parts.append(f"{layout.dp} replicas")
    return ", ".join(parts)


def _available_label(e: Estimate) -> str:
    """'available', with the engine's own memory budget where it sets one (docs/formulas.md §3)."""
    params = e.engine_profile.parameters
    share, kv_share = float(memory_utilization(params, e.layout.tp)), params.kv_free_fraction
    parts = ([f"{e.engine} uses {share:.0%} of the device"] if share < 1 else []) + \
        ([f"{e.engine}'s KV cache takes {kv_share:.0%} of what is left"] if kv_share < 1 else [])
    return f"available ({'; '.join(parts)})" if parts else "available"


def _kv_cache_label(e: Estimate, batch: float) -> str:
    """What the KV cache line counts: every sequence at its final length, or under a load on an engine that
    allocates KV as tokens come, the current length its sequences hold on average (docs/formulas.md §14)."""
    if e.serving.under_load and e.engine_profile.parameters.allocates_kv_on_demand:
        return f"KV cache ({batch:,.4g} x {e.prompt_tokens + e.output_tokens / 2:,.0f} tokens held on average)"
    return f"KV cache ({batch:,.4g} x {e.prompt_tokens + e.output_tokens:,.0f} tokens)"


def format_estimate(e: Estimate, measured: list[dict] | None = None, verify: list[dict] | None = None) -> str:
    """The readable report for one estimate; with ``measured`` rows (:func:`measured_rows`) and
    ``verify`` commands (:func:`verify_commands`), their two sections too."""
    r, hw = e.results, e.hardware
    bw, peak = hw.memory_bandwidth_bytes_per_s, hw.peak_flops_per_s(e.compute_dtype)
    batch = running_batch(e)
    head = [
        f"{e.model.name} on {e.layout.devices} x {hw.name} ({_layout_text(e.layout)}): weights "
        f"{e.weight_format.name} (math in {e.compute_dtype}), KV cache {e.kv_format.name}",
        f"workload: {_load_text(e)}, {_lengths_text(e)}, "
        f"{'fused (FlashAttention-style)' if e.serving.attention == 'fused' else 'unfused'} attention, "
        f"{e.serving.kv_alloc} KV cache" + (f", {e.serving.prefix_tokens}-token cached prefix"
                                            if e.serving.prefix_tokens else ""),
        f"device: {_bandwidth_text(bw)}, {_flops_text(peak)} dense {e.compute_dtype}, "
        f"{hw.memory_capacity_bytes / 2**30:.0f} GiB {hw.memory.type.value} memory",
    ] + ([f"memory: {hw.name} with {hw.memory_capacity_bytes / 2**30:g} GiB ("
          f"{'the largest sold' if hw.memory_capacity_bytes == hw.memory.options.base[-1] else 'chosen'}; "
          f"--memory-gib {'|'.join(f'{s:g}' for s in hw.memory_options_gib)})"] if hw.memory.options else [])
    memory = [
        ("weights", gigabytes(r["memory_weights_bytes"])),
        (_kv_cache_label(e, batch), gigabytes(r["memory_kv_cache_bytes"])),
        ("activation workspace" + (" or sampler warm-up" if e.engine_profile.parameters.sampler_warmup_bytes_per_logit
                                   else ""), gigabytes(r["memory_activation_bytes"])),
        ("runtime reserve", gigabytes(r["memory_reserve_bytes"])),
        ("required", gigabytes(r["memory_required_bytes"])),
        (_available_label(e), gigabytes(r["memory_available_bytes"])),
    ]
    if r["offloaded_bytes"] > 0:
        where = (f"{e.serving.gpu_layers} of {e.model.shape.num_layers} layers on the device, the rest run by "
                 f"the host CPU ({e.serving.host_cpu})" if e.serving.gpu_layers is not None else
                 f"streamed over the host link ({_host_link(hw)}) on every forward pass")
        memory.insert(1, ("offloaded to host memory", gigabytes(r["offloaded_bytes"])))
    verdict = (f"fits; largest batch at this context: {r['max_batch']:,.0f}" if r["fits"] else
               f"DOES NOT FIT: needs {gigabytes(r['memory_required_bytes'])} per device, has "
               f"{gigabytes(r['memory_available_bytes'])}; largest batch that fits: {r['max_batch']:,.0f}. "
               "Try more devices (--gpus), a smaller weight format, or a shorter context.")
    parts = ["\n".join(head), "", "Memory per device", table(memory)]
    if r["offloaded_bytes"] > 0:
        parts.append(f"  offloaded weights: {where}")
    parts.append("  -> " + verdict)
    if r.get("saturated"):
        parts += ["", f"SATURATED: the requested load exceeds what this configuration can serve (at most about "
                      f"{r['max_rate']:.2f} requests/s); no steady state exists, so no "
                      "latencies are reported. Lower the rate, or add devices or replicas."]
    if e.runnable:
        finite_run = e.serving.num_requests if e.serving.under_load else 0
        parts += ["", "Latency and throughput", table(_speed_rows(r, finite_run)), "", "Bound",
                  "  " + _bound_line(e, "prefill"), "  " + _bound_line(e, "decode"),
                  "", "Where the time goes", table(_time_rows(r), header=("", *_phase_names(batch))),
                  "", f"Bytes per decode step at the mean context ({r['mean_decode_context']:,.0f} tokens)",
                  table(_ledger_rows(r, "decode_bytes", gigabytes))]
    parts += ["", f"Efficiencies: {e.efficiency_source}.", f"Intervals: {r.get('interval_basis', 'none')}."]
    parts += local_sections(measured, verify)
    paid = [text for key, text in ENGINE_BYTE_TERMS.items() if r.get(f"decode_bytes_{key}")]
    added = (f"Bytes the engine's code adds: {'; '.join(paid)} (docs/formulas.md §13).",) if paid else ()
    parts += ["", "Definitions"] + [f"  {d}" for d in DEFINITIONS + added]
    parts += [f"warning: {w}" for w in e.warnings]
    return "\n".join(parts)


def local_sections(measured: list[dict] | None, verify: list[dict] | None) -> list[str]:
    """The measured rows beside the estimate, and the commands to measure it here (each when given)."""
    parts = []
    if measured is not None:
        parts += ["", format_measured(measured)]
    if verify is not None:
        parts += ["", format_verify(verify)]
    return parts


def _lengths_text(e: Estimate) -> str:
    if e.serving.lengths is None:
        return f"prompt {e.prompt_tokens} tokens, output {e.output_tokens} tokens"
    return (f"request lengths from {e.serving.lengths} (mean prompt {e.prompt_tokens:,.0f} tokens, "
            f"mean output {e.output_tokens:,.0f} tokens)")


def _load_text(e: Estimate) -> str:
    s = e.serving
    if s.all_at_once:
        r = e.results
        queued = f", {r['queued_requests']:,.0f} waiting for a slot" if r["queued_requests"] > 0 else ""
        return (f"{s.num_requests:,} requests sent at once (at most {r['max_running_sequences']:,.0f} run at "
                f"once{queued})")
    if not s.under_load:
        return f"batch {e.batch}"
    load = f"{s.concurrency} request{'s' * (s.concurrency != 1)} in flight" if s.concurrency else \
        f"{s.rate:g} requests/s arriving"
    if s.concurrency and s.num_requests:
        load += f", {s.num_requests:,} in all, " + (f"the first {s.concurrency} sent at once" if s.concurrency > 1
                                                    else "one after another")
    chunk = f", chunked prefill {s.chunked_prefill} tokens/step" if s.chunked_prefill else ""
    hits = f", {s.prefix_hit_rate:.0%} prefix-cache hits" if s.prefix_hit_rate else ""
    if s.kv_offload != "none":
        hits += (f" ({s.kv_offload_gib:g} GiB {s.kv_offload} tier: "
                 f"{seconds(e.results['kv_tier_load_s'])} to load a prompt's hits; the prefix cache holds "
                 f"{e.results['prefix_cache_tokens']:,.0f} tokens)")
    r = e.results
    queued = f", {r['queued_requests']:.0f} waiting for a slot" if r["queued_requests"] > 0 else ""
    return (f"{load} (continuous batching{chunk}{hits}; at most {r['max_running_sequences']:,.0f} sequences run "
            f"at once{queued}; steady decode batch {r['steady_batch']:.1f})")


def _with_range(r: dict, key: str, fmt) -> str:
    """The figure ``key`` and, when the estimate carries one, its 80% interval."""
    return fmt(r[key]) + _range(r, key, fmt)


def _range(r: dict, key: str, fmt) -> str:
    """' (80%: low-high)' when the estimate carries an interval for ``key``."""
    if f"{key}_low" not in r:
        return ""
    low, high = r[f"{key}_low"], r[f"{key}_high"]
    remark = band_remark(r[key], low, high, key.endswith("_s"))
    return f"  (80%: {fmt(low)} - {fmt(high)}{'; ' + remark if remark else ''})"


def _speed_rows(r: dict, finite_run: int = 0) -> list[tuple[str, str]]:
    """The latency and throughput rows; ``finite_run``: the requests of a finite run at a rate or through a
    closed loop's clients, whose output tokens/s is over the run."""
    if "steady_batch" in r:
        return [
            ("TTFT (with queueing)", _with_range(r, "ttft_s", seconds)),
            ("prefill of one prompt alone", seconds(r["ttft_prefill_s"])),
            ("ITL (mean, with the prompts' cost)", _with_range(r, "itl_s", seconds)),
            ("ITL at the last step (context prompt + output)", seconds(r["itl_end_s"])),
            ("decode tokens/s per user", _with_range(r, "decode_tps_per_seq", rate)),
            *([("run ends with its last reply, after", seconds(r["run_duration_s"]))] if finite_run
              else []),
            *([("TTFT of the first requests, sent at once (mean)", seconds(r["first_wave_ttft_s"]))]
              if math.isfinite(r.get("first_wave_ttft_s", math.nan)) else []),
            (f"output tokens/s over the run of {finite_run:,} request{'s' * (finite_run != 1)}" if finite_run else
             "output tokens/s, all users", _with_range(r, "throughput_out_tps", rate)),
            ("requests/s served", f"{r['request_rate']:.2f}"),
            ("end-to-end latency", _with_range(r, "e2e_latency_s", seconds)),
            ("TTFT p50 / p90 / p99", " / ".join(seconds(r[f"ttft_{q}_s"]) for q in ("p50", "p90", "p99"))),
            ("ITL p50 / p90 / p99", " / ".join(seconds(r[f"itl_{q}_s"]) for q in ("p50", "p90", "p99"))),
            ("end-to-end p99", seconds(r["e2e_p99_s"])),
            ("max sustainable rate (KV-bound)", f"{r['max_rate']:.2f} requests/s"),
        ]
    if "prefill_phase_s" in r:   # an all-at-once run (docs/formulas.md §14)
        return [
            ("TTFT (mean over the requests)", _with_range(r, "ttft_s", seconds)),
            ("all prompts prefilled after", seconds(r["prefill_phase_s"]) if math.isfinite(r["prefill_phase_s"])
             else NOT_AVAILABLE),
            ("ITL (mean gap over every output token)", _with_range(r, "itl_s", seconds)),
            ("end-to-end latency (mean)", _with_range(r, "e2e_latency_s", seconds)),
            ("run ends when its longest reply does, after", seconds(r["run_duration_s"])),
            ("output tokens/s over the run", _with_range(r, "throughput_out_tps", rate)),
            ("TTFT p50 / p90 / p99", " / ".join(seconds(r[f"ttft_{q}_s"]) for q in ("p50", "p90", "p99"))),
            ("ITL p50 / p90 / p99", " / ".join(seconds(r[f"itl_{q}_s"]) for q in ("p50", "p90", "p99"))),
            ("end-to-end p99", seconds(r["e2e_p99_s"])),
        ]
    return [
        ("TTFT (prefill, no queueing)", _with_range(r, "ttft_s", seconds)),
        ("prefill tokens/s", _with_range(r, "prefill_tps", rate)),
        ("ITL (mean over the generation)", _with_range(r, "itl_s", seconds)),
        ("ITL at the last step (context prompt + output)", seconds(r["itl_end_s"])),
        ("decode tokens/s per sequence", _with_range(r, "decode_tps_per_seq", rate)),
        ("decode tokens/s, whole batch", _with_range(r, "decode_tps_total", rate)),
        ("end-to-end latency", seconds(r["e2e_latency_s"])),
        ("TPOT inclusive of first token", seconds(r["tpot_inclusive_s"])),
    ]


def _phase_names(batch: float) -> tuple[str, str]:
    """What the bound lines and the time breakdown describe: at more than one sequence, the running batch's prompts
    at once (under a load far longer than the pass one prompt's TTFT waits for) and its decode step."""
    if batch == 1:
        return "prefill", "decode step"
    return f"prefill of {batch:,.4g} prompts at once", f"decode step of {batch:,.4g} sequences"


def _time_rows(r: dict) -> list[tuple[str, str, str]]:
    """Time per part; communication and offload only when they happen."""
    return [(label, seconds(r[f"prefill_{key}"]), seconds(r[f"decode_{key}"]))
            for label, key in (("linear layers", "linear_s"), ("attention", "attention_s"),
                               ("communication", "communication_s"), ("offload", "offload_s"),
                               ("fixed overheads", "overhead_s"))
            if key in ("linear_s", "attention_s", "overhead_s") or r[f"prefill_{key}"] + r[f"decode_{key}"] > 0]


def _ledger_rows(r: dict, prefix: str, fmt) -> list[tuple[str, str]]:
    """The ledger's terms, less those this engine does not pay (an eager engine's KV-head copy, say)."""
    terms = [k for k in r if k.startswith(prefix + "_") and not k.endswith("_total") and r[k] != 0]
    rows = [(k[len(prefix) + 1:].replace("_", " "), fmt(r[k])) for k in terms]
    return rows + [("total", fmt(r[f"{prefix}_total"]))]


def format_speculation(grid, alphas, gammas, title: str) -> str:
    """The speculative-decoding speed-up grid: one row per draft length γ, one column per acceptance rate α."""
    rows = [(f"γ = {g}", *(f"{v:.2f}" if math.isfinite(v) else NOT_AVAILABLE for v in row))
            for g, row in zip(gammas, grid)]
    return f"Speculative decoding speed-up, {title}\n" + table(rows, header=("", *(f"α={a:g}" for a in alphas)))


def format_quantity(q) -> str:
    return f"{q.value:g} {q.unit}"


def format_spec(fields: Iterable[tuple[str, str, str]]) -> str:
    """Rows of (field, value, source) for `roofline show`."""
    return table([(k, v, s) for k, v, s in fields], header=("field", "value", "source / note"), align_numbers=False)


def _deployment_row(r: dict) -> tuple[str, ...]:
    layout = (f"{r['prefill_devices']} prefill + {r['decode_devices']} decode" if r["mode"] == "disaggregated"
              else f"{r['devices']} devices, continuous batching")
    if r["saturated"]:
        return r["mode"], layout, "saturated", "saturated", f"{r['decode_batch']:.1f}"
    return r["mode"], layout, seconds(r["ttft_s"]), seconds(r["itl_s"]), f"{r['decode_batch']:.1f}"


def format_disaggregation(result: dict) -> str:
    """Disaggregated vs aggregated serving at one rate, and the fewest devices meeting targets."""
    rows = [_deployment_row(result["disaggregated"]), _deployment_row(result["aggregated"])]
    lines = [f"At {result['rate']:g} requests/s:",
             table(rows, header=("serving", "devices", "TTFT", "ITL", "decode batch per instance")),
             f"  KV transfer per request (prefill -> decode): {seconds(result['disaggregated']['kv_transfer_s'])}"]
    if "fewest_devices" in result:
        t = result["targets"]
        goal = ", ".join(f"{k.replace('max_', '').replace('_s', '').upper()} <= {seconds(v)}" for k, v in t.items() if v)
        lines += ["", f"Fewest devices meeting {goal}:"]
        for mode, best in result["fewest_devices"].items():
            lines.append(f"  {mode}: " + ("none within the search limit" if best is None else
                                           f"{best['devices']} devices ({_deployment_row(best)[1]}), TTFT "
                                           f"{seconds(best['ttft_s'])}, ITL {seconds(best['itl_s'])}"))
    return "\n".join(lines)
