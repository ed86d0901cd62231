"""Text for `roofline plan`: the shortlist, the prices used, and why the rest were rejected."""

from __future__ import annotations

import math
from collections import Counter

from estimator.formatting import NOT_AVAILABLE, rate, seconds, table
from estimator.planning.search import PlanResult


def target_basis(targets) -> str:
    """Which latencies the targets apply to: the means or a percentile under the load, and which interval end."""
    level = targets.latency_percentile
    basis = f"TTFT {level} and 1/ITL {level} under the load" if level else "mean TTFT and tokens/s per user"
    return basis + (" at the pessimistic (p90) end of the 80% interval" if targets.percentile == "p90" else "")


def describe_targets(spec) -> str:
    t, w = spec.targets, spec.workload
    load = f"{w.concurrency} requests in flight" if w.concurrency else f"{w.rate:g} requests/s"
    mix = ", ".join(f"{r.prompt}->{r.output} tokens" + (f" ({r.share:g})" if len(w.requests) > 1 else "")
                    for r in w.requests)
    if w.lengths:
        mix = f"lengths {w.lengths} (mean {mix})"
    hits = f", {w.prefix_hit_rate:.0%} of prompt tokens from the prefix cache" if w.prefix_hit_rate else ""
    goals = [f"TTFT <= {t.max_ttft_s:g} s" if t.max_ttft_s else "", f">= {t.min_tps_per_user:g} tokens/s per user"
             if t.min_tps_per_user else ""]
    return (f"{', '.join(spec.models)}; {mix}; {load}{hits}; targets: {', '.join(g for g in goals if g) or 'none'} "
            f"(on {target_basis(t)}); {spec.constraints.deployment}; engine {spec.engine}")


def _usd(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else NOT_AVAILABLE


def tp_cell(c: dict) -> str:
    """A candidate's tensor-parallel degree for a table, marked when attention runs data-parallel."""
    return f"{c['tp']} attn-DP" if c["attention_dp"] else str(c["tp"])


def tensor_parallel_text(c: dict) -> str:
    """A candidate's layout in words."""
    if not c["attention_dp"]:
        return f"tensor parallel {c['tp']}"
    experts = f", experts over {c['ep']}" if c["ep"] > 1 else ""
    return f"tensor parallel {c['tp']} with attention data-parallel{experts}"


def format_plan(result: PlanResult, top: int = 15) -> str:
    lines = [f"Plan: {describe_targets(result.spec)}", ""]
    if result.configurations:
        level = result.spec.targets.latency_percentile   # its latencies beside the means
        rows = [(c["hardware"], c["count"], tp_cell(c), c["format"], f"{c['batch']:.0f}", seconds(c["ttft_s"]),
                 rate(c["decode_tps_per_seq"]),
                 *((seconds(c[f"ttft_{level}_s"]), seconds(c[f"itl_{level}_s"])) if level else ()),
                 rate(c["throughput_out_tps"]), _usd(c["cost_per_million_tokens_usd"]), "*" if c.get("pareto") else "")
                for c in result.configurations[:top]]
        lines += [f"{len(result.configurations)} configurations meet the targets (cheapest first; * = Pareto front "
                  f"of cost against per-user speed{f' at ITL {level}' if level else ''}):",
                  table(rows, header=("hardware", "n", "tp", "format", "batch", "TTFT", "tok/s/user",
                                      *((f"TTFT {level}", f"ITL {level}") if level else ()), "tok/s all",
                                      "$/1M tokens", "pareto"))]
    else:
        lines.append("No configuration meets the targets.")
        if result.closest_miss:
            c = result.closest_miss
            lines.append(f"  closest miss: {c['count']} x {c['hardware']} ({c['format']}, {tensor_parallel_text(c)}): "
                         f"{c['reason']}")
    reasons = Counter(r["reason"].split(":")[0] for r in result.rejected)
    lines += ["", "Rejected: " + (", ".join(f"{n} {why}" for why, n in reasons.most_common()) or "none")]
    if result.prices:
        lines += ["", "Prices used (per device-hour):"]
        lines += [f"  {p['hardware']}: {p['usd_per_device_hour']:.3f} USD/h from {p['source']}" for p in result.prices
                  if any(c["hardware"] == p["hardware"] for c in result.configurations[:top])]
    return "\n".join(lines)
