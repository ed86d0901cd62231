"""`roofline explain`: why a configuration runs at its speed, in words and numbers.

It names the bytes a decode step moves and where they come from, the bound and
the ridge point, and ranks the changes that would help most. Each change is
*re-estimated* with the same model, not taken from a rule of thumb ("INT4 is
2x faster"): the speed-up printed is what the roofline gives for this model,
device and workload.
"""

from __future__ import annotations

from estimator.errors import RooflineError
from estimator.evaluation.api import Estimate, estimate
from estimator.formatting import gigabytes, rate, seconds, to_json
from estimator.reporting.estimate_text import running_batch
from estimator.serving.workload import tp_copies_kv, with_attention_dp
from estimator.specs.database import Database, load_database
from estimator.units import GB, TB, TFLOPS

# Speculative decoding offered as a change: EAGLE-style heads at 5 % of a step, 4 drafts, α = 0.7
# (EAGLE-2 reports acceptance lengths of 4-5 tokens at γ = 5-6 on chat data, arXiv 2406.16858).
SPECULATION = dict(draft_cost=0.05, draft_tokens=4, acceptance=0.7)


def candidate_changes(e: Estimate, kwargs: dict) -> list[tuple[str, dict]]:
    """Changes worth re-estimating for this configuration, as (label, keyword overrides)."""
    out = []
    bits = e.weight_format.linear_bits
    for fmt, label in (("fp8", "fp8 weights"), ("nvfp4", "NVFP4 weights"), ("int4-awq", "4-bit AWQ weights")):
        if e.hardware.peak_flops_per_s(fmt if fmt != "nvfp4" else "fp4") or fmt == "int4-awq":
            if {"fp8": 8, "nvfp4": 4.5, "int4-awq": 4.2}[fmt] < bits - 0.5:
                out.append((label, {"weight_format": fmt}))
    if e.kv_format.bits > 8:
        out.append(("fp8 KV cache", {"kv_format": "fp8"}))
    tp = e.layout.tp * 2
    if e.model.shape.num_attention_heads % tp == 0 and e.serving.gpu_layers is None:
        out.append((f"{e.layout.devices * 2} devices with tensor parallelism {tp}",
                    {"n_gpus": e.layout.devices * 2, "tp": tp}))
    if e.layout.tp > 1 and not e.layout.attention_dp and tp_copies_kv(e.model, e.layout.tp):
        ep = with_attention_dp(e.layout, e.model).ep
        out.append((f"attention data-parallel over the same {e.layout.tp} ranks (no KV copies"
                    f"{f', experts over {ep}' if ep > 1 else ''})", {"attention_dp": True, "ep": ep}))
    if not e.serving.draft_tokens:
        out.append(("speculative decoding (EAGLE-style heads, 4 drafts, assumed acceptance 0.7)", SPECULATION))
    if e.serving.attention == "unfused":
        out.append(("fused (FlashAttention) attention", {"attention": "fused"}))
    if e.results["offloaded_bytes"] > 0:
        out.append(("a device with enough memory to avoid offloading (same bandwidth)", {"offload": "none",
                                                                                          "gpu_layers": None}))
    return [(label, {**kwargs, **change}) for label, change in out]


def ranked_changes(e: Estimate, kwargs: dict, db: Database) -> list[dict]:
    """Re-estimate every candidate that runs, ranked by decode speed per sequence.

    For a configuration that runs, the speed-ups over it are given; for one that
    does not (too big, or saturated), the changes that make it run and their speeds.
    """
    ranked = []
    for label, changed in candidate_changes(e, kwargs):
        try:
            other = _as_if_it_fit(e) if label.startswith("a device with enough memory") else estimate(**changed, db=db)
        except RooflineError:
            continue
        if other is None or not other.runnable:
            continue
        change = {"change": label, "decode_tps_per_seq": other.decode_tps_per_seq, "ttft_s": other.ttft_s}
        if e.runnable:
            change.update(decode_speedup=other.decode_tps_per_seq / e.decode_tps_per_seq,
                          ttft_speedup=e.ttft_s / other.ttft_s if other.ttft_s else 1.0)
        ranked.append(change)
    return sorted(ranked, key=lambda c: -c["decode_tps_per_seq"])


def _as_if_it_fit(e: Estimate):
    return None if e.results["offload_slowdown"] <= 1 else type("Fit", (), {
        "runnable": True, "decode_tps_per_seq": e.decode_tps_per_seq * e.results["offload_slowdown"],
        "ttft_s": e.ttft_s})()


def explain(kwargs: dict, db: Database | None = None, as_json: bool = False) -> str:
    """The explanation for one configuration given as :func:`estimate` keyword arguments."""
    db = db or load_database()
    e = estimate(**kwargs, db=db)
    changes = ranked_changes(e, kwargs, db)
    if as_json:
        return to_json({"estimate": e.to_dict(), "changes": changes})
    return "\n".join(_paragraphs(e) + (_change_lines(changes) if e.runnable else _rescue_lines(changes)))


def _copies(r: dict) -> str:
    """The clause naming the copies the engine's code makes of the cache before attention, if it makes any."""
    if not r["decode_bytes_kv_expand"]:
        return ""
    return (f", {gigabytes(r['decode_bytes_kv_expand'])} copying it before attention reads it (grouped heads "
            "expanded, or a quantized cache widened to 16 bits, as this engine's code does; docs/formulas.md §13)")


def _everything_else(r: dict) -> float:
    """Decode-step bytes beyond the weights, the cache attention reads and the copies made of it."""
    return r["decode_bytes_total"] - r["decode_bytes_weights"] - r["decode_bytes_kv_read"] - r["decode_bytes_kv_expand"]


def _prefill_batch_text(e: Estimate) -> str:
    """Which prompts the prefill bound is of where that is not one: the running batch's at once, and under a load
    the pass one prompt alone takes, which is what its TTFT waits for."""
    r = e.results
    batch = running_batch(e)
    if batch == 1:
        return ""
    alone = f"; one prompt alone takes {seconds(r['ttft_prefill_s'])}" if "ttft_prefill_s" in r else ""
    return f" with the {batch:,.4g} running prompts at once{alone}"


def _paragraphs(e: Estimate) -> list[str]:
    r, hw = e.results, e.hardware
    head = f"Why {e.model.name} ({e.weight_format.name}) runs as it does on {e.layout.devices} x {hw.name}:"
    if not e.runnable:
        return [head, f"- it cannot run: {'; '.join(e.warnings) or 'it does not fit'} "
                      f"(needs {gigabytes(r['memory_required_bytes'])} per device, has "
                      f"{gigabytes(r['memory_available_bytes'])}). See `roofline estimate` for the breakdown."]
    bandwidth = hw.memory_bandwidth_bytes_per_s / TB
    weights_gb, total_gb = r["decode_bytes_weights"] / GB, r["decode_bytes_total"] / GB
    lines = [
        head,
        f"- Each decode step moves {gigabytes(r['decode_bytes_total'])}: {weights_gb:.2f} GB of weights "
        f"({e.model.name}'s active weights at {e.weight_format.linear_bits:g} bits, read once per step for all "
        f"{r.get('steady_batch', e.batch):.4g} sequences), {gigabytes(r['decode_bytes_kv_read'])} of KV cache "
        f"(mean context {r['mean_decode_context']:,.0f} tokens, stored at {r['kv_cache_bytes_per_token'] / 1024:.0f} "
        f"KiB per token){_copies(r)} and {gigabytes(_everything_else(r))} of everything else.",
        f"- At {bandwidth:.2f} TB/s per device that is {seconds(r['decode_memory_s'])} of memory traffic against "
        f"{seconds(r['decode_compute_s'])} of compute: decode is {r['decode_bound']}-bound (intensity "
        f"{r['decode_intensity_flops_per_byte']:,.1f} FLOP/byte, ridge point {r['ridge_flops_per_byte']:,.0f}); "
        f"one sequence sees {rate(r['decode_tps_per_seq'])} tokens/s"
        + (f", {rate(r['decode_tps_total'])} tokens/s for the batch." if e.batch > 1 or "steady_batch" in r else "."),
        f"- Prefill of {e.prompt_tokens:,.0f} tokens per prompt needs "
        f"{_per_prompt_flops(e) / 1e12:,.1f} TFLOP per prompt at "
        f"{hw.peak_flops_per_s(e.compute_dtype) / TFLOPS:,.0f} TFLOPS dense {e.compute_dtype}: "
        f"{r['prefill_bound']}-bound{_prefill_batch_text(e)}, TTFT {seconds(r['ttft_s'])}.",
    ]
    if r["offloaded_bytes"] > 0:
        lines.insert(3, f"- {gigabytes(r['offloaded_bytes'])} of weights per device live in host memory; moving or "
                        f"computing them adds {seconds(r['decode_offload_s'])} to every step, so the same run with "
                        f"everything on the device would decode {r['offload_slowdown']:.1f}x faster.")
    if total_gb > 0 and r["decode_bytes_kv_read"] / GB > weights_gb:
        lines.append("- The KV cache, not the weights, dominates decode traffic here: long contexts and large "
                     "batches pay per token of context, so KV precision and GQA/MLA matter more than weight format.")
    return lines


def _change_lines(changes: list[dict]) -> list[str]:
    if not changes:
        return ["", "No single change from the usual list speeds this configuration up."]
    lines = ["", "What would help most (each re-estimated, not a rule of thumb):"]
    for i, c in enumerate(changes[:2], 1):
        lines.append(f"  {i}. {c['change']}: {c['decode_speedup']:.2f}x decode tokens/s per sequence, "
                     f"{c['ttft_speedup']:.2f}x TTFT")
    others = ", ".join(f"{c['change']} {c['decode_speedup']:.2f}x" for c in changes[2:])
    if others:
        lines.append(f"  also considered: {others}")
    return lines


def _rescue_lines(changes: list[dict]) -> list[str]:
    if not changes:
        return ["", "None of the usual changes (fewer bits, more devices, fp8 KV cache) makes it run; "
                    "try `roofline estimate --offload auto`, a shorter context or a larger device."]
    lines = ["", "Changes that make it run (each re-estimated):"]
    lines += [f"  - {c['change']}: {rate(c['decode_tps_per_seq'])} tokens/s per sequence, TTFT {seconds(c['ttft_s'])}"
              for c in changes]
    return lines


def _per_prompt_flops(e) -> float:
    """Prefill FLOPs of one prompt: the ledger counts one micro-batch of one replica (B / (dp · micro-batches))."""
    r = e.results
    prompts = r.get("steady_batch", e.batch) / (e.layout.dp * r["micro_batches"])
    return r["prefill_flops_total"] / max(prompts, 1e-12)
