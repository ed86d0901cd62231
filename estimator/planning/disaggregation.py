"""Disaggregated prefill and decode, against aggregated serving on the same devices.

Disaggregated serving (DistServe, Splitwise, Dynamo) runs prompts on a prefill
pool of X devices and generation on a decode pool of Y devices; each request's
KV cache crosses the link between them once. Under an open-loop rate R split
evenly over the instances of each pool:

- prefill: an M/D/1 queue per instance with service t_pf (one prompt), so
  TTFT = t_pf + u · t_pf / (2 (1 − u)) + transfer, u = R_pf · t_pf;
- transfer: P · kv_bytes_per_token over the device's scale-up link (NVLink),
  or its host link where it has none (the pools are assumed to share a node);
- decode: the steady state of :mod:`estimator.serving.continuous_batching` without prefill stalls,
  since the decode pool never prefills.

Aggregated serving on X + Y devices uses (X + Y) / (tp · pp) replicas, each
with continuous batching (prefill stalls included). Neither is reported as a
steady state when the rate saturates it.
"""

from __future__ import annotations

import numpy as np

from estimator.errors import ConfigurationError
from estimator.evaluation.api import estimate, sweep
from estimator.evaluation.columns import link_bandwidth
from estimator.serving.continuous_batching import steady_state
from estimator.serving.workload import Layout

BATCH_GRID = np.unique(np.round(np.geomspace(1, 4096, 48))).astype(int)


def _itl_curve(model, gpu, layout: Layout, weight_format, kv_format, prompt, output, db):
    """ITL of one instance at a grid of batches, for interpolation inside the fixed point."""
    table = sweep([model], [gpu], [weight_format], [kv_format], list(BATCH_GRID), [prompt], [output],
                  [Layout(tp=layout.tp, pp=layout.pp, ep=layout.ep)], db=db)
    itl = table.columns["itl_s"]
    return lambda n: np.interp(np.log(np.maximum(n, 1)), np.log(BATCH_GRID), itl)


def disaggregated(model, gpu, rate: float, prefill_devices: int, decode_devices: int, *, tp: int = 1, pp: int = 1,
                  ep: int = 1, weight_format="bf16", kv_format="f16", prompt_tokens=512, output_tokens=256,
                  db=None) -> dict:
    """TTFT, ITL and saturation of X prefill and Y decode devices at ``rate`` requests/s."""
    per_instance = tp * pp
    for label, devices in (("prefill", prefill_devices), ("decode", decode_devices)):
        if devices < per_instance or devices % per_instance:
            raise ConfigurationError(f"--{label}-gpus {devices} must be a positive multiple of tp x pp = {per_instance}")
    layout = Layout(tp=tp, pp=pp, ep=ep)
    one = estimate(model, gpu, tp=tp, pp=pp, ep=ep, weight_format=weight_format, kv_format=kv_format,
                   batch=1, prompt_tokens=prompt_tokens, output_tokens=output_tokens, db=db)
    prefill_rate = rate / (prefill_devices // per_instance)
    u = prefill_rate * one.ttft_s
    transfer_s = prompt_tokens * one.kv_cache_bytes_per_token / link_bandwidth(one.hardware)
    ttft = one.ttft_s + u * one.ttft_s / (2 * (1 - u)) + transfer_s if u < 1 else float("nan")
    itl_at = _itl_curve(model, gpu, layout, weight_format, kv_format, prompt_tokens, output_tokens, db)
    decode = steady_state(itl_at, np.array(0.0), np.array(float(prompt_tokens)), output_tokens, 0.0,
                          rate / (decode_devices // per_instance), np.array(one.max_batch))
    saturated = bool(u >= 1 or decode["saturated"])
    return {"mode": "disaggregated", "devices": prefill_devices + decode_devices, "prefill_devices": prefill_devices,
            "decode_devices": decode_devices, "ttft_s": None if saturated else ttft,
            "itl_s": None if saturated else float(decode["itl_s"]), "kv_transfer_s": transfer_s,
            "prefill_utilisation": u, "decode_batch": float(decode["steady_batch"]), "saturated": saturated}


def aggregated(model, gpu, rate: float, devices: int, *, tp: int = 1, pp: int = 1, ep: int = 1,
               weight_format="bf16", kv_format="f16", prompt_tokens=512, output_tokens=256, db=None) -> dict:
    """TTFT and ITL of continuous batching on ``devices`` (data-parallel replicas of tp x pp)."""
    e = estimate(model, gpu, n_gpus=devices, tp=tp, pp=pp, ep=ep, weight_format=weight_format, kv_format=kv_format,
                 prompt_tokens=prompt_tokens, output_tokens=output_tokens, rate=rate, db=db)
    saturated = not e.runnable
    return {"mode": "aggregated", "devices": devices, "ttft_s": None if saturated else e.ttft_s,
            "itl_s": None if saturated else e.itl_s, "decode_batch": e.steady_batch / e.layout.dp,
            "saturated": saturated}


def meets(result: dict, max_ttft_s: float | None, max_itl_s: float | None) -> bool:
    if result["saturated"]:
        return False
    return ((max_ttft_s is None or result["ttft_s"] <= max_ttft_s)
            and (max_itl_s is None or result["itl_s"] <= max_itl_s))


def fewest_devices(model, gpu, rate: float, *, max_devices: int = 64, max_ttft_s=None, max_itl_s=None,
                   tp: int = 1, **kwargs) -> dict:
    """The smallest aggregated and disaggregated deployments meeting the targets at ``rate``."""
    best = {"aggregated": None, "disaggregated": None}
    for total in range(tp, max_devices + 1, tp):
        if best["aggregated"] is None:
            candidate = aggregated(model, gpu, rate, total, tp=tp, **kwargs)
            if meets(candidate, max_ttft_s, max_itl_s):
                best["aggregated"] = candidate
        if best["disaggregated"] is None and total >= 2 * tp:
            for x in range(tp, total, tp):
                candidate = disaggregated(model, gpu, rate, x, total - x, tp=tp, **kwargs)
                if meets(candidate, max_ttft_s, max_itl_s):
                    best["disaggregated"] = candidate
                    break
        if all(best.values()):
            break
    return best

