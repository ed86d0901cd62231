"""`roofline validate --local`: time a real decoder on this machine and compare with the estimate.

The decoder is calibrate.decoder's eager reference decoder, built from the model's
exact shapes in the database with random weights. It prefills a prompt, samples the first token, then
decodes with the cache; TTFT and decode tokens/s are timed with the device
synchronised, after an untimed run at the same shapes (steady state); TTFT is the median of
three prefills. The same runs are then estimated for this device with its
calibration profile (a given file, the newest of this device, or measured first) and the
pytorch-eager engine profile, which describes that decoder
and the two are printed side by side. MLA models are refused; the point is a
faithful, small end-to-end check, not a serving engine.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import replace

from estimator.evaluation.api import estimate
from estimator.formatting import seconds, table
from estimator.specs.database import Database, load_database

QUICK_MODEL = "Qwen/Qwen2.5-0.5B"
DEFAULT_MODELS = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B")
DTYPE_BY_DEVICE = {"cpu": "float32", "cuda": "bfloat16", "mps": "float16"}
REFERENCE_ENGINE = "pytorch-eager"   # the engine profile of the decoder timed here
FORMAT_BY_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def measure(torch, forward, new_cache, device, vocab, batch, prompt, output, prefills: int = 3) -> dict:
    """TTFT (prefill + first token, the median of ``prefills`` runs) and mean decode step time, in steady state.

    The same prefill and decode run once first, untimed: the first call at each shape pays for kernel
    selection and plan building, which a long-running engine pays once. On an H200 with torch 2.11, the
    default fused attention (cuDNN) built a plan for each new KV length: about 60 ms per decode step the
    first time a length was seen, three times the step itself for Llama-3.1-8B (docs/formulas.md §13).
    """
    from calibrate.timing import synchronize
    tokens = torch.randint(0, vocab, (batch, prompt), device=device)

    def prefill():
        synchronize(torch, device)
        t0 = time.perf_counter()
        token = forward(tokens, cache, 0)
        synchronize(torch, device)
        return token, time.perf_counter() - t0

    def decode(token):
        t0 = time.perf_counter()
        for step in range(output - 1):
            token = forward(token, cache, prompt + step)
        synchronize(torch, device)
        return (time.perf_counter() - t0) / max(output - 1, 1)

    with torch.inference_mode():
        cache = new_cache(batch, prompt + output)
        decode(prefill()[0])                                     # warm-up at the measured shapes
        token, ttfts = None, []
        for _ in range(prefills):
            token, ttft = prefill()
            ttfts.append(ttft)
        step_s = decode(token)
    return {"ttft_s": statistics.median(ttfts), "itl_s": step_s, "decode_tps_per_seq": 1 / step_s}


def validate_local(device: str = "cpu", models=None, quick: bool = False, db: Database | None = None,
                   as_json: bool = False, batches=None, prompts=None, output_tokens: int | None = None,
                   calibration: str | None = None, progress=None) -> str:
    """Measure, estimate and compare; returns the printed table (or JSON).

    ``batches`` and ``prompts`` replace the default runs (their product); ``calibration`` is a profile
    file to use instead of the newest one of this device (or a fresh measurement); ``progress`` is
    called with each run's row as JSON as soon as it is measured, so a run cut short keeps its rows.
    """
    from calibrate import require_torch
    from calibrate.decoder import build_decoder
    from calibrate.identity import cpu_name
    from calibrate.run import calibrate, check_device, plan_for, tiny_plan, with_models
    from estimator.efficiency.calibration_profile import CURVE_DTYPE_OF_FORMAT, find_profile, load_profile

    torch = require_torch()
    check_device(torch, device)
    db = db or load_database()
    if calibration:
        profile = load_profile(calibration)
    else:
        profile = find_profile(cpu_name()) if device == "cpu" else None
    names = models or ([QUICK_MODEL] if quick else DEFAULT_MODELS)
    dtype_name = DTYPE_BY_DEVICE[device]
    if profile is None:
        # a fresh measurement, for this run only: the dtype the decoder runs in, and the models' own decode
        # matrices (the calibration shape's curve misses a CPU's slow skinny GEMMs on large ones, §13)
        # and the quick plan's GEMM sizes even in a smoke run: a prompt's GEMMs are of the order of a GFLOP each,
        # and a 512^3 one (3 ms on 2 CPU cores) is too short to time on a busy machine: its rate swung from 87 to
        # 134 GFLOP/s over three calibrations, the 1024^3 one's from 138 to 144, and the predicted TTFT with it
        quick_plan = plan_for(device, "quick")
        plan = replace(tiny_plan(device) if quick else quick_plan,
                       dtypes=(CURVE_DTYPE_OF_FORMAT[FORMAT_BY_DTYPE[dtype_name]],), gemm_sizes=quick_plan.gemm_sizes)
        profile = calibrate(device, "quick", plan=with_models(plan, [db.models.get(n) for n in names]), db=db)
    output = output_tokens or (16 if quick else 32)
    if batches or prompts:
        runs = [(b, p, output) for b in (batches or [1]) for p in (prompts or [128])]
    else:
        runs = [(1, 128, output), (4, 128, output)] if quick else \
            [(1, 128, output), (1, 512, output), (4, 256, output), (8, 128, output)]
    rows = []
    for name in names:
        spec = db.models.get(name)
        forward, new_cache = build_decoder(torch, spec.shape, device, getattr(torch, dtype_name), spec.name)
        for batch, prompt, output in runs:
            got = measure(torch, forward, new_cache, device, spec.shape.vocab_size, batch, prompt, output)
            e = estimate(spec, "local", calibration=profile, weight_format=FORMAT_BY_DTYPE[dtype_name],
                         batch=batch, prompt_tokens=prompt, output_tokens=output, engine=REFERENCE_ENGINE)
            rows.append({"model": spec.name, "batch": batch, "prompt": prompt, "output": output,
                         "measured_ttft_s": got["ttft_s"], "predicted_ttft_s": e.ttft_s,
                         "measured_decode_tps": got["decode_tps_per_seq"],
                         "predicted_decode_tps": e.decode_tps_per_seq})
            if progress:
                progress(json.dumps(rows[-1]))
    if as_json:
        return json.dumps({"device": profile.device.name, "profile": profile.label, "runs": rows}, indent=2)
    lines = [(f"Local validation on {profile.device.name} ({dtype_name}; profile {profile.label}; engine "
              f"profile {REFERENCE_ENGINE}: the reference decoder)")]
    lines.append(table([(r["model"], r["batch"], r["prompt"], seconds(r["measured_ttft_s"]),
                         seconds(r["predicted_ttft_s"]), f"{r['predicted_ttft_s'] / r['measured_ttft_s'] - 1:+.0%}",
                         f"{r['measured_decode_tps']:.1f}", f"{r['predicted_decode_tps']:.1f}",
                         f"{r['predicted_decode_tps'] / r['measured_decode_tps'] - 1:+.0%}") for r in rows],
                       header=("model", "batch", "prompt", "TTFT measured", "predicted", "error",
                               "decode tok/s measured", "predicted", "error")))
    return "\n".join(lines)
