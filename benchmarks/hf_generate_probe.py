"""Time Hugging Face transformers' own generate() on a random-weight model built from a database shape.

TTFT is generate() with one new token; the decode step is (generate() with N new tokens - TTFT) / (N - 1);
both in steady state (the same calls run once untimed first), greedy, with no end-of-sequence stop. Each batch
runs unpadded and with its first prompt left-padded by 8 tokens: with padding transformers passes an attention
mask, and its SDPA attention then copies grouped KV heads out (repeat_kv) instead of attending with
enable_gqa, as it does without a mask on torch >= 2.5 (docs/formulas.md §13). Dense models only, built as
LlamaForCausalLM with the model's sizes. One JSON line per run.

    python benchmarks/hf_generate_probe.py --device cuda --model meta-llama/Llama-3.1-8B --batch 1 --batch 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

PAD = 8


def build(torch, shape, device, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                         num_hidden_layers=shape.num_layers, num_attention_heads=shape.num_attention_heads,
                         num_key_value_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                         vocab_size=shape.vocab_size, max_position_embeddings=shape.max_context,
                         tie_word_embeddings=shape.tie_word_embeddings)
    torch.set_default_dtype(dtype)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def timed_generate_s(torch, model, ids, mask, new_tokens, device):
    from calibrate.timing import synchronize
    synchronize(torch, device)
    t0 = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                   do_sample=False)
    synchronize(torch, device)
    return time.perf_counter() - t0


def main() -> None:
    import torch
    import transformers

    from estimator.specs.database import load_database
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--batch", type=int, action="append", required=True)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--output", type=int, default=16)
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    db = load_database()
    for name in args.model:
        spec = db.models.get(name)
        model = build(torch, spec.shape, args.device, dtype)
        with torch.inference_mode():
            for batch in args.batch:
                ids = torch.randint(1, spec.shape.vocab_size, (batch, args.prompt), device=args.device)
                for padded in (False, True):
                    mask = torch.ones_like(ids)
                    if padded:
                        mask[0, :PAD] = 0
                    timed_generate_s(torch, model, ids, mask, args.output, args.device)   # warm-up at these shapes
                    ttft_s = statistics.median(timed_generate_s(torch, model, ids, mask, 1, args.device)
                                               for _ in range(3))
                    total_s = statistics.median(timed_generate_s(torch, model, ids, mask, args.output, args.device)
                                                for _ in range(2))
                    step_s = (total_s - ttft_s) / (args.output - 1)
                    print(json.dumps({"model": spec.name, "batch": batch, "prompt": args.prompt,
                                      "output": args.output, "padded": padded, "ttft_s": ttft_s, "step_s": step_s,
                                      "decode_tps_per_seq": 1 / step_s, "attention": model.config._attn_implementation,
                                      "transformers": transformers.__version__, "torch": torch.__version__}),
                          flush=True)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
