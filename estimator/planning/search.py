"""The search behind `roofline plan` (see :mod:`estimator.planning.spec` for the plan and the cost model)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from estimator.errors import ConfigurationError
from estimator.evaluation.api import sweep
from estimator.evaluation.intervals import pessimistic_ratios
from estimator.planning.cost import HOURS_PER_YEAR, hourly_cost, purchase_price
from estimator.planning.spec import DEFAULT_FORMATS, FP4_FORMATS, PlanSpec
from estimator.serving.workload import Layout, ServingOptions, check_layout, tp_copies_kv, with_attention_dp
from estimator.specs.database import Database, load_database
from estimator.specs.formats import format_family, weight_format
from estimator.specs.hardware import DeviceClass, Hardware

HOURS_PER_MONTH = HOURS_PER_YEAR / 12


@dataclass
class PlanResult:
    spec: PlanSpec
    configurations: list[dict]          # meeting the targets, cheapest first
    rejected: list[dict]                # with their reason
    prices: list[dict]                  # the prices used and where they come from
    closest_miss: dict | None = None    # when nothing meets the targets
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """JSON-ready: non-finite numbers become null."""
        clean = lambda c: {k: (None if isinstance(v, float) and not np.isfinite(v) else v)  # noqa: E731
                           for k, v in c.items() if k not in ("miss",)}
        return {"configurations": [clean(c) for c in self.configurations],
                "rejected": [clean(c) for c in self.rejected], "prices": self.prices,
                "closest_miss": clean(self.closest_miss) if self.closest_miss else None, "notes": self.notes}


def candidate_devices(spec: PlanSpec, db: Database) -> list[Hardware]:
    """The devices named or classed in the constraints; by default every accelerator (no CPUs)."""
    wanted = spec.constraints.gpus
    if not wanted:
        return [hw for hw in db.hardware if hw.device_class is not DeviceClass.cpu]
    classes = {c.value for c in DeviceClass}
    devices = []
    for name in wanted:
        if name in classes:
            devices += [hw for hw in db.hardware if hw.device_class.value == name]
        else:
            devices.append(db.hardware.get(name))
    return list({hw.name: hw for hw in devices}.values())


def candidate_formats(spec: PlanSpec) -> list[str]:
    names = spec.constraints.formats or list(DEFAULT_FORMATS)
    formats = [weight_format(n) for n in names]
    if spec.constraints.min_bits:
        formats = [f for f in formats if f.linear_bits >= spec.constraints.min_bits]
    if not formats:
        raise ConfigurationError(f"no weight format left: {names} with at least {spec.constraints.min_bits} bits")
    return [f.name for f in formats]


def layouts_for(model, counts, per_node) -> list[Layout]:
    """For each device count, the widest tensor parallelism within a node the model allows; the rest replicas.

    Where that tensor parallelism copies the KV cache onto its ranks (an MLA latent, or fewer KV heads than
    ranks), the same devices with attention data-parallel are a candidate too (:func:`with_attention_dp`): it
    holds more sequences, while plain TP splits the attention weights and is faster for few.
    """
    out = []
    for n in counts:
        for tp in sorted((t for t in range(1, min(n, per_node) + 1) if n % t == 0), reverse=True):
            layout = Layout(tp=tp, dp=n // tp, devices_per_node=per_node)
            try:
                check_layout(model, layout)
            except ConfigurationError:
                continue
            out.append(layout)
            if tp > 1 and tp_copies_kv(model, tp):
                out.append(with_attention_dp(layout, model))
            break
    return out



def device_counts(max_devices: int) -> list[int]:
    counts = [1]
    while counts[-1] * 2 <= max_devices:
        counts.append(counts[-1] * 2)
    return sorted(set(counts + [max_devices]))


def _canonical_prices(spec: PlanSpec, db: Database) -> PlanSpec:
    """Price overrides keyed by any of a device's names, re-keyed by its database name."""
    devices = {db.hardware.get(name).name: price for name, price in spec.prices.devices.items()}
    return spec.model_copy(update={"prices": spec.prices.model_copy(update={"devices": devices})})


def judged_latencies(row: dict, latency_percentile: str | None) -> tuple[float, float]:
    """TTFT and tokens/s per user that targets apply to: the means, or a percentile of the queueing model.

    ``row`` is a results row under a load (a sweep row, ``Estimate.results`` or a plan configuration);
    with ``latency_percentile`` "p99" the TTFT is ``ttft_p99_s`` and the speed 1 / ``itl_p99_s``
    (docs/formulas.md §14). NaN where the percentile is missing (a saturated row).
    """
    if not latency_percentile:
        return row["ttft_s"], row["decode_tps_per_seq"]
    itl = float(row.get(f"itl_{latency_percentile}_s", np.nan))
    return float(row.get(f"ttft_{latency_percentile}_s", np.nan)), 1.0 / itl if itl > 0 else np.nan


def targeted_latencies(spec: PlanSpec, moe: bool, hw: Hardware, fmt: str, single_client: bool,
                       row: dict) -> tuple[float, float]:
    """The TTFT and tokens/s per user the plan's targets judge in one results row of format ``fmt`` on ``hw``.

    The means or the plan's latency percentile (:func:`judged_latencies`), at the end of the 80% interval
    the plan asks for (docs/formulas.md §14, "Targets at a percentile"). The report judges with it too.
    """
    return _percentile_adjusted(spec, moe, hw, fmt, single_client,
                                *judged_latencies(row, spec.targets.latency_percentile))


def _percentile_adjusted(spec: PlanSpec, moe: bool, hw: Hardware, fmt: str, single_client: bool, ttft: float,
                         tps: float):
    """At p90, judge the pessimistic end of the estimate's 80% interval (of a mean or a latency percentile): the
    plan's loads put every latency in the serving band but a single client's per-user speed, a batch of one's."""
    if spec.targets.percentile != "p90":
        return ttft, tps
    ttft_low, speed_low = pessimistic_ratios(moe, format_family(fmt), spec.engine, hw.vendor, hw.device_class.value,
                                             single_client)
    return ttft / ttft_low, tps * speed_low


def _results_for_candidates(spec: PlanSpec, model, devices, formats, layouts, db) -> list[dict]:
    """Every (device, format, layout) for one model under the plan's load, one dict per request type."""
    w = spec.workload
    serving = ServingOptions(**w.serving)
    per_request = []
    for request in w.requests:
        table = sweep([model], devices, formats, ["f16"], [1], [request.prompt], [request.output], layouts,
                      serving=serving, engine=spec.engine, detail=True, db=db)
        per_request.append([{**table.row(i), "layout_spec": layouts[int(table.index["layout"][i])]}
                            for i in range(len(table))])
    return per_request


def plan(spec: PlanSpec, db: Database | None = None) -> PlanResult:
    """Search devices × count × layout × format for the plan; see :mod:`estimator.planning.spec`."""
    db = db or load_database()
    spec = _canonical_prices(spec, db)
    models = [db.models.get(m) for m in spec.models]
    devices = candidate_devices(spec, db)
    formats = candidate_formats(spec)
    counts = device_counts(spec.constraints.max_gpus)
    configurations, rejected, prices = [], [], {}
    single_client = ServingOptions(**spec.workload.serving).single_client   # the same load for every candidate
    for hw in devices:
        prices[hw.name] = hourly_cost(hw, spec.prices, spec.constraints.deployment)
    for model in models:
        layouts = layouts_for(model, counts, spec.constraints.devices_per_node)
        if not layouts:
            rejected.append({"model": model.name, "reason": "no device count the model's heads divide"})
            continue
        usable = []
        for hw in devices:
            uncomputable = [f for f in formats
                            if all(hw.peak_flops_per_s(d) is None for d in weight_format(f).compute_dtypes)]
            if prices[hw.name][0] is None:
                rejected.append({"model": model.name, "hardware": hw.name, "reason":
                                 f"{prices[hw.name][1]} for {spec.constraints.deployment} (add one under prices:)"})
            elif uncomputable:
                rejected.append({"model": model.name, "hardware": hw.name, "reason":
                                 f"publishes no peak for the math of {', '.join(uncomputable)}"})
            else:
                usable.append(hw)
        if not usable:
            continue
        rows = _results_for_candidates(spec, model, usable, formats, layouts, db)
        for variants in zip(*rows):
            configurations.append(_judge(spec, model, variants, db, prices, single_client))
    good = sorted((c for c in configurations if c["meets_targets"]), key=lambda c: c["cost_per_million_tokens_usd"])
    _mark_pareto(good)
    bad = [c for c in configurations if not c["meets_targets"]]
    closest = min(bad, key=lambda c: c["miss"], default=None) if not good else None
    return PlanResult(spec, good, rejected + [{k: c[k] for k in ("model", "hardware", "count", "tp", "format",
                                                                   "reason")} for c in bad],
                      [{"hardware": name, "usd_per_device_hour": cost, "source": source}
                       for name, (cost, source) in sorted(prices.items()) if cost is not None], closest)


def _judge(spec: PlanSpec, model, variants: tuple[dict, ...], db, prices, single_client: bool) -> dict:
    """One candidate over the request mix: the worst latency, the share-weighted cost; reasons if rejected.
    ``single_client``: the plan's load is one client (its per-user speed is judged at a batch of one's band)."""
    first = variants[0]
    hw = db.hardware.get(first["hardware"])
    layout = first["layout_spec"]
    count, tp = layout.devices, layout.tp
    hourly = prices[hw.name][0] * count
    shares = np.array([r.share for r in spec.workload.requests])
    shares = shares / shares.sum()
    fits = all(v["fits"] for v in variants)
    saturated = any(v.get("saturated") for v in variants)
    fmt = first["weight_format"]
    adjusted = [_percentile_adjusted(spec, model.shape.moe, hw, fmt, single_client, v["ttft_s"],
                                     v["decode_tps_per_seq"]) for v in variants]
    ttft = max(a[0] for a in adjusted)
    tps = min(a[1] for a in adjusted)
    level = spec.targets.latency_percentile   # targets on the worst request type's percentile, else the means
    judged = [targeted_latencies(spec, model.shape.moe, hw, fmt, single_client, v) for v in variants]
    judged_ttft, judged_tps = float(np.max([a[0] for a in judged])), float(np.min([a[1] for a in judged]))
    throughput = float(np.dot(shares, [v["throughput_out_tps"] for v in variants]))
    cost_per_million = hourly / (throughput * 3600) * 1e6 if throughput > 0 and np.isfinite(throughput) else np.inf
    reasons, miss = [], 0.0
    if first["weight_format"] in FP4_FORMATS and hw.peak_flops_per_s("fp4") is None:
        reasons.append(f"no FP4 tensor cores: {hw.name} cannot run {first['weight_format']}")
        miss += 100
    elif not fits:
        need = max(v["memory_required_bytes"] for v in variants) / 1e9
        reasons.append(f"does not fit: needs {need:.1f} GB per device, has {first['memory_available_bytes'] / 1e9:.1f}")
        miss += 10
    elif saturated:
        reasons.append(f"saturated: the load exceeds what {count} device(s) serve "
                       f"(~{min(v['max_rate'] for v in variants):.2f} requests/s at most)")
        miss += 5
    else:
        reasons, miss = missed_targets(spec, judged_ttft, judged_tps)
    budget = spec.constraints.budget_usd
    if budget:
        spend = (count * purchase_price(hw, spec.prices) if spec.constraints.deployment == "on_prem"
                 else hourly * HOURS_PER_MONTH)
        if spend > budget:
            reasons.append(f"over budget: {spend:,.0f} USD > {budget:,.0f}")
            miss += spend / budget - 1
    return {
        "model": model.name, "hardware": hw.name, "count": count, "tp": tp, "ep": layout.ep,
        "attention_dp": layout.attention_dp, "format": first["weight_format"], "layout": first["layout"],
        "batch": float(np.mean([v.get("steady_batch", 1) for v in variants])),
        "ttft_s": ttft, "decode_tps_per_seq": tps, "throughput_out_tps": throughput,
        "cost_per_hour_usd": hourly, "cost_per_million_tokens_usd": cost_per_million,
        "tokens_per_s_per_usd_per_hour": throughput / hourly if hourly else None,
        "tokens_per_joule": throughput / (count * hw.tdp.base * spec.prices.utilization) if hw.tdp.base else None,
        "meets_targets": not reasons, "reason": "; ".join(reasons), "miss": miss, "latency_percentile": level,
        **({f"ttft_{level}_s": judged_ttft, f"itl_{level}_s": 1.0 / judged_tps if judged_tps > 0 else np.inf}
           if level else {}),
    }


def missed_targets(spec: PlanSpec, ttft: float, tps: float) -> tuple[list[str], float]:
    """Why a candidate misses the TTFT and per-user speed targets (at the plan's latency percentile), and by how much."""
    t, level = spec.targets, spec.targets.latency_percentile
    reasons, miss = [], 0.0
    if (t.max_ttft_s or t.min_tps_per_user) and not (np.isfinite(ttft) and np.isfinite(tps)):
        return [f"no {level or 'mean'} latency: the queueing model has no steady state here"], 5.0
    if t.max_ttft_s and ttft > t.max_ttft_s:
        reasons.append(f"TTFT{f' {level}' if level else ''} too high: {ttft:.3g} s > {t.max_ttft_s:g} s")
        miss += ttft / t.max_ttft_s - 1
    if t.min_tps_per_user and tps < t.min_tps_per_user:
        reasons.append(f"too slow per user: {tps:.3g} tokens/s{f' (1 / ITL {level})' if level else ''} "
                       f"< {t.min_tps_per_user:g}")
        miss += t.min_tps_per_user / tps - 1
    return reasons, miss


def _mark_pareto(configs: list[dict]) -> None:
    """Flag the configurations no other beats on both cost and inter-token latency (1 / tokens/s per user).

    The per-user speed is the one the targets judge: the mean, or 1 / ITL at the plan's latency percentile.
    """
    speed = {id(c): judged_latencies(c, c.get("latency_percentile"))[1] for c in configs}
    for c in configs:
        c["pareto"] = not any(o["cost_per_million_tokens_usd"] <= c["cost_per_million_tokens_usd"]
                              and speed[id(o)] >= speed[id(c)] and o is not c
                              and (o["cost_per_million_tokens_usd"] < c["cost_per_million_tokens_usd"]
                                   or speed[id(o)] > speed[id(c)]) for o in configs)
