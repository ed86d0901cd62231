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
steady state when the rate saturates it, or when the model does not fit.

Every other option of :func:`estimator.evaluation.api.estimate` (engine, calibration,
formats, KV-cache and attention options, offload, speculative decoding, the
network between nodes) applies to both pools and to the aggregated deployment alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from estimator.errors import ConfigurationError
from estimator.evaluation.api import Estimate, estimate, resolve_calibrated_hardware, sweep
from estimator.evaluation.columns import link_bandwidth
from estimator.serving.continuous_batching import steady_state
from estimator.specs.database import load_database

BATCH_GRID = np.unique(np.round(np.geomspace(1, 4096, 48))).astype(int)


@dataclass(frozen=True)
class Instance:
    """One tp x pp instance: a request on it alone, and its decode step time at any batch."""

    alone: Estimate
    itl_at: Callable

    @property
    def devices(self) -> int:
        return self.alone.layout.tp * self.alone.layout.pp


def instance(model, gpu, *, calibration="auto", engine="generic", db=None, **options) -> Instance:
    """The instance both pools are made of; ``options`` are :func:`estimate`'s (tp, pp, formats, serving ...)."""
    db = db or load_database()
    device, profile = resolve_calibrated_hardware(gpu, calibration, db)
    alone = estimate(model, device, batch=1, calibration=profile, engine=engine, db=db, **options)
    table = sweep([alone.model], [device], [alone.weight_format], [alone.kv_format], list(BATCH_GRID),
                  [alone.prompt_tokens], [alone.output_tokens], [alone.layout], serving=alone.serving, engine=engine,
                  calibrations=None if profile is None else {device.name: profile}, db=db)
    itl = table.columns["itl_s"]
    return Instance(alone, lambda n: np.interp(np.log(np.maximum(n, 1)), np.log(BATCH_GRID), itl))


def pools(inst: Instance, rate: float, prefill_devices: int, decode_devices: int) -> dict:
    """TTFT, ITL and saturation of X prefill and Y decode devices made of ``inst`` at ``rate`` requests/s."""
    per_instance = inst.devices
    for label, devices in (("prefill", prefill_devices), ("decode", decode_devices)):
        if devices < per_instance or devices % per_instance:
            raise ConfigurationError(f"--{label}-gpus {devices} must be a positive multiple of tp x pp = "
                                     f"{per_instance}")
    one = inst.alone
    u = rate / (prefill_devices // per_instance) * one.ttft_s
    transfer_s = one.prompt_tokens * one.kv_cache_bytes_per_token / link_bandwidth(one.hardware)
    ttft = one.ttft_s + u * one.ttft_s / (2 * (1 - u)) + transfer_s if u < 1 else float("nan")
    decode = steady_state(inst.itl_at, np.array(0.0), np.array(float(one.prompt_tokens)), one.output_tokens, 0.0,
                          rate / (decode_devices // per_instance), np.array(one.max_batch))
    saturated = bool(not one.fits or u >= 1 or decode["saturated"])
    return {"mode": "disaggregated", "devices": prefill_devices + decode_devices, "prefill_devices": prefill_devices,
            "decode_devices": decode_devices, "ttft_s": None if saturated else ttft,
            "itl_s": None if saturated else float(decode["itl_s"]), "kv_transfer_s": transfer_s,
            "prefill_utilisation": u, "decode_batch": float(decode["steady_batch"]), "saturated": saturated}


def disaggregated(model, gpu, rate: float, prefill_devices: int, decode_devices: int, *, tp: int = 1, pp: int = 1,
                  db=None, **options) -> dict:
    """TTFT, ITL and saturation of X prefill and Y decode devices at ``rate`` requests/s."""
    return pools(instance(model, gpu, tp=tp, pp=pp, db=db, **options), rate, prefill_devices, decode_devices)


def aggregated(model, gpu, rate: float, devices: int, *, tp: int = 1, pp: int = 1, db=None, **options) -> dict:
    """TTFT and ITL of continuous batching on ``devices`` (data-parallel replicas of tp x pp)."""
    e = estimate(model, gpu, n_gpus=devices, tp=tp, pp=pp, rate=rate, db=db, **options)
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
                   tp: int = 1, pp: int = 1, db=None, **options) -> dict:
    """The smallest aggregated and disaggregated deployments meeting the targets at ``rate``."""
    inst = instance(model, gpu, tp=tp, pp=pp, db=db, **options)
    step = inst.devices
    best = {"aggregated": None, "disaggregated": None}
    for total in range(step, max_devices + 1, step):
        if best["aggregated"] is None:
            candidate = aggregated(model, gpu, rate, total, tp=tp, pp=pp, db=db, **options)
            if meets(candidate, max_ttft_s, max_itl_s):
                best["aggregated"] = candidate
        if best["disaggregated"] is None:
            for x in range(step, total, step):
                candidate = pools(inst, rate, x, total - x)
                if meets(candidate, max_ttft_s, max_itl_s):
                    best["disaggregated"] = candidate
                    break
        if all(best.values()):
            break
    return best


def compare(model, gpu, rate: float, prefill_devices: int, decode_devices: int, *, max_devices: int = 64,
            max_ttft_s: float | None = None, max_itl_s: float | None = None, db=None, **options) -> dict:
    """Disaggregated X + Y against aggregated on X + Y at ``rate``; with targets, the fewest devices each way."""
    result = {"rate": rate,
              "disaggregated": disaggregated(model, gpu, rate, prefill_devices, decode_devices, db=db, **options),
              "aggregated": aggregated(model, gpu, rate, prefill_devices + decode_devices, db=db, **options)}
    if max_ttft_s or max_itl_s:
        result["fewest_devices"] = fewest_devices(model, gpu, rate, max_devices=max_devices, max_ttft_s=max_ttft_s,
                                                  max_itl_s=max_itl_s, db=db, **options)
        result["targets"] = {"max_ttft_s": max_ttft_s, "max_itl_s": max_itl_s}
    return result
