"""Where an eager decode step's time goes on a GPU: the reference decoder (calibrate/decoder.py) decoding with
a growing KV length (as generation does) against a fixed one, and with each fused-attention backend.

A per-step cost that does not grow with depth and vanishes at a fixed length is a cost paid per new tensor
shape (a kernel plan built for each new KV length), not per op. Prints one JSON line per case.

    python benchmarks/eager_decode_probe.py --device cuda --model Qwen/Qwen2.5-0.5B --model meta-llama/Llama-3.1-8B

With --profile it also prints where a growing decode step of the first --model spends its host time and its
device time (torch.profiler), and the device's busy time per step against the step's wall time: a step that
takes longer than both its host time and its device time waits on the two in turn.
"""

from __future__ import annotations

import argparse
import json
import time


def decode_s(torch, forward, cache, device, token, start, steps, grow):
    from calibrate.timing import synchronize
    forward(token, cache, start)
    synchronize(torch, device)
    t0 = time.perf_counter()
    for step in range(steps):
        token = forward(token, cache, start + (step if grow else 0))
    synchronize(torch, device)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from calibrate.decoder import build_decoder
    from estimator.specs.database import load_database
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--profile", action="store_true", help="also print torch.profiler's top ops of a growing "
                                                                "decode of the first --model, by host time")
    args = parser.parse_args()
    db = load_database()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    backends = {"default": None, "flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    from calibrate.benchmarks import TINY_DECODER
    from estimator.specs.model import Shape
    shapes = [(f"tiny-{n}-layers", Shape(**TINY_DECODER, num_layers=n)) for n in (2, 10)]
    shapes += [(spec.name, spec.shape) for spec in map(db.models.get, args.model)]
    for name, shape in shapes:
        forward, new_cache = build_decoder(torch, shape, args.device, dtype, name)
        batch, prompt = (1, 512) if name.startswith("tiny") else (args.batch, args.prompt)
        cache = new_cache(batch, prompt + 4 * args.steps)
        token = torch.zeros(batch, 1, dtype=torch.long, device=args.device)
        with torch.inference_mode():
            forward(torch.zeros(batch, prompt, dtype=torch.long, device=args.device), cache, 0)
            for label, backend in backends.items():
                for grow in (False, True):
                    try:
                        if backend is None:
                            step = decode_s(torch, forward, cache, args.device, token, prompt, args.steps, grow)
                        else:
                            with sdpa_kernel([backend]):
                                step = decode_s(torch, forward, cache, args.device, token, prompt, args.steps, grow)
                        print(json.dumps({"model": name, "batch": batch, "prompt": prompt, "backend": label,
                                          "kv_length": "growing" if grow else "fixed", "step_s": step}), flush=True)
                    except RuntimeError as exc:
                        print(json.dumps({"model": name, "backend": label, "error": str(exc)[:200]}),
                              flush=True)

        if args.profile and name == shapes[2][0]:
            from torch.profiler import ProfilerActivity, profile
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
            steps = 4
            with torch.inference_mode():
                wall_s = decode_s(torch, forward, cache, args.device, token, prompt + 2 * args.steps, steps, True)
                with profile(activities=activities) as prof:
                    decode_s(torch, forward, cache, args.device, token, prompt + 2 * args.steps, steps, True)
            averages = prof.key_averages()
            busy_s = sum(getattr(e, "self_device_time_total", 0) for e in averages) / 1e6 / (steps + 1)
            host_s = sum(e.self_cpu_time_total for e in averages) / 1e6 / (steps + 1)
            print(json.dumps({"model": name, "batch": batch, "prompt": prompt, "wall_step_s": wall_s,
                              "device_busy_step_s": busy_s, "host_ops_step_s": host_s}), flush=True)
            for key in ("self_cpu_time_total", "self_device_time_total"):
                print(averages.table(sort_by=key, row_limit=15, max_name_column_width=40))


if __name__ == "__main__":
    main()
