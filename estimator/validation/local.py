"""`roofline validate --local`: time a real decoder on this machine and compare with the estimate.

The decoder is built in torch from the model's exact shapes in the database
(random weights made directly on the device in its dtype, so nothing is downloaded
and a large model does not wait on the CPU): embedding, L blocks of RMSNorm,
grouped-query attention with a KV cache (scaled_dot_product_attention), RMSNorm
and a SwiGLU MLP, or for a mixture of experts a router choosing the top k of E
SwiGLU experts per token plus the shared experts (the first dense layers dense),
final norm and output head. It prefills a prompt, samples the first token, then
decodes with the cache; TTFT and decode tokens/s are timed with the device
synchronised. The same runs are then estimated for this device with its
calibration profile (a given file, the newest of this device, or measured first)
and the two are printed side by side. MLA models are refused; the point is a
faithful, small end-to-end check, not a serving engine.
"""

from __future__ import annotations

import json
import math
import time

from estimator.errors import ConfigurationError
from estimator.evaluation.api import estimate
from estimator.formatting import seconds, table
from estimator.specs.database import Database, load_database
from estimator.specs.model import ModelSpec

QUICK_MODEL = "Qwen/Qwen2.5-0.5B"
DEFAULT_MODELS = ("Qwen/Qwen2.5-0.5B", "meta-llama/Llama-3.2-1B")
DTYPE_BY_DEVICE = {"cpu": "float32", "cuda": "bfloat16", "mps": "float16"}
FORMAT_BY_DTYPE = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def build_decoder(torch, spec: ModelSpec, device: str, dtype):
    """A random-weight decoder with ``spec``'s shapes; returns (forward, new_cache)."""
    s = spec.shape
    if s.mla is not None:
        raise ConfigurationError(f"--local builds GQA decoders (dense or MoE); {spec.name} uses MLA attention")
    extras = [words for words, used in (
        ("Gated DeltaNet layers", s.linear_attention), ("sparse attention", s.sparse_attention),
        ("per-layer embeddings", s.per_layer_embeddings), ("KV-cache sharing", s.num_kv_shared_layers),
        ("AltUp", s.altup_num_inputs > 1), ("LAuReL", s.laurel_rank), ("an attention output gate",
                                                                       s.attention_output_gate)) if used]
    if extras:
        raise ConfigurationError(f"--local builds plain GQA decoders (dense or MoE); {spec.name} uses "
                                 f"{', '.join(extras)}")
    F = torch.nn.functional
    d, h, kv, dh, L = s.hidden_size, s.num_attention_heads, s.num_kv_heads, s.head_dim, s.num_layers
    g = torch.Generator(device=device).manual_seed(0)

    def weight(*shape):   # made where it is used, in its dtype: no host copy of a large model
        return torch.randn(*shape, generator=g, device=device, dtype=dtype) / math.sqrt(shape[-1])

    def swiglu(width):
        return {"w1": weight(width, d), "w3": weight(width, d), "w2": weight(d, width)}

    def mlp_of(layer: int) -> dict:
        if s.moe is None or layer < s.moe.num_dense_layers:
            return {"dense": swiglu(s.intermediate_size)}
        return {"router": weight(s.moe.num_experts, d),
                "experts": [swiglu(s.moe.expert_intermediate_size) for _ in range(s.moe.num_experts)],
                "shared": [swiglu(s.moe.shared_width) for _ in range(s.moe.num_shared_experts)]}

    layers = [{"wq": weight(h * dh, d), "wk": weight(kv * dh, d), "wv": weight(kv * dh, d), "wo": weight(d, h * dh),
               **mlp_of(i)} for i in range(L)]
    embedding, head = weight(s.vocab_size, d), weight(s.vocab_size, d)

    def norm(x):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def ffn(w, y):
        return F.linear(F.silu(F.linear(y, w["w1"])) * F.linear(y, w["w3"]), w["w2"])

    def mlp(w, y):
        if "dense" in w:
            return ffn(w["dense"], y)
        flat = y.reshape(-1, d)
        weights, chosen = torch.topk(torch.softmax(F.linear(flat, w["router"]).float(), -1), s.moe.experts_per_token)
        out = sum(ffn(shared, flat) for shared in w["shared"]) if w["shared"] else torch.zeros_like(flat)
        for e in torch.unique(chosen).tolist():   # each routed expert runs on the tokens that chose it
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            out = out.index_add(0, rows, ffn(w["experts"][e], flat[rows]) * weights[rows, slot, None].to(flat.dtype))
        return out.view_as(y)

    def forward(tokens, cache, start):
        B, T = tokens.shape
        x = embedding[tokens]
        for i, w in enumerate(layers):
            y = norm(x)
            q = F.linear(y, w["wq"]).view(B, T, h, dh).transpose(1, 2)
            k = F.linear(y, w["wk"]).view(B, T, kv, dh).transpose(1, 2)
            v = F.linear(y, w["wv"]).view(B, T, kv, dh).transpose(1, 2)
            cache[i][0][:, :, start:start + T] = k
            cache[i][1][:, :, start:start + T] = v
            keys, values = cache[i][0][:, :, :start + T], cache[i][1][:, :, :start + T]
            keys, values = keys.repeat_interleave(h // kv, 1), values.repeat_interleave(h // kv, 1)
            a = F.scaled_dot_product_attention(q, keys, values, is_causal=(T > 1))
            x = x + F.linear(a.transpose(1, 2).reshape(B, T, h * dh), w["wo"])
            x = x + mlp(w, norm(x))
        return F.linear(norm(x[:, -1]), head).argmax(-1, keepdim=True)

    def new_cache(batch, length):
        return [(torch.empty(batch, kv, length, dh, device=device, dtype=dtype),
                 torch.empty(batch, kv, length, dh, device=device, dtype=dtype)) for _ in range(L)]

    return forward, new_cache


def measure(torch, forward, new_cache, device, vocab, batch, prompt, output) -> dict:
    """TTFT (prefill + first token) and mean decode step time, device synchronised."""
    from calibrate.timing import synchronize
    tokens = torch.randint(0, vocab, (batch, prompt), device=device)
    with torch.inference_mode():
        cache = new_cache(batch, prompt + output)
        forward(tokens[:, :8], new_cache(batch, 8), 0)          # warm-up
        synchronize(torch, device)
        t0 = time.perf_counter()
        token = forward(tokens, cache, 0)
        synchronize(torch, device)
        ttft = time.perf_counter() - t0
        t1 = time.perf_counter()
        for step in range(output - 1):
            token = forward(token, cache, prompt + step)
        synchronize(torch, device)
        decode = (time.perf_counter() - t1) / max(output - 1, 1)
    return {"ttft_s": ttft, "itl_s": decode, "decode_tps_per_seq": 1 / decode}


def validate_local(device: str = "cpu", models=None, quick: bool = False, db: Database | None = None,
                   as_json: bool = False, batches=None, prompts=None, output_tokens: int | None = None,
                   calibration: str | None = None) -> str:
    """Measure, estimate and compare; returns the printed table (or JSON).

    ``batches`` and ``prompts`` replace the default runs (their product); ``calibration`` is a profile
    file to use instead of the newest one of this device (or a fresh measurement).
    """
    from calibrate import require_torch
    from calibrate.identity import cpu_name
    from calibrate.run import calibrate, check_device, tiny_plan
    from estimator.efficiency.calibration_profile import find_profile, load_profile

    torch = require_torch()
    check_device(torch, device)
    db = db or load_database()
    if calibration:
        profile = load_profile(calibration)
    else:
        profile = find_profile(cpu_name()) if device == "cpu" else None
    if profile is None:
        profile = calibrate(device, "quick", plan=tiny_plan(device) if quick else None, db=db)
    dtype_name = DTYPE_BY_DEVICE[device]
    output = output_tokens or (16 if quick else 32)
    if batches or prompts:
        runs = [(b, p, output) for b in (batches or [1]) for p in (prompts or [128])]
    else:
        runs = [(1, 128, output), (4, 128, output)] if quick else \
            [(1, 128, output), (1, 512, output), (4, 256, output), (8, 128, output)]
    rows = []
    for name in (models or ([QUICK_MODEL] if quick else DEFAULT_MODELS)):
        spec = db.models.get(name)
        forward, new_cache = build_decoder(torch, spec, device, getattr(torch, dtype_name))
        for batch, prompt, output in runs:
            got = measure(torch, forward, new_cache, device, spec.shape.vocab_size, batch, prompt, output)
            e = estimate(spec, "local", calibration=profile, weight_format=FORMAT_BY_DTYPE[dtype_name],
                         batch=batch, prompt_tokens=prompt, output_tokens=output, engine="transformers")
            rows.append({"model": spec.name, "batch": batch, "prompt": prompt, "output": output,
                         "measured_ttft_s": got["ttft_s"], "predicted_ttft_s": e.ttft_s,
                         "measured_decode_tps": got["decode_tps_per_seq"],
                         "predicted_decode_tps": e.decode_tps_per_seq})
    if as_json:
        return json.dumps({"device": profile.device.name, "profile": profile.label, "runs": rows}, indent=2)
    lines = [f"Local validation on {profile.device.name} ({dtype_name}; profile {profile.label}; engine "
             "profile transformers: eager PyTorch)"]
    lines.append(table([(r["model"], r["batch"], r["prompt"], seconds(r["measured_ttft_s"]),
                         seconds(r["predicted_ttft_s"]), f"{r['predicted_ttft_s'] / r['measured_ttft_s'] - 1:+.0%}",
                         f"{r['measured_decode_tps']:.1f}", f"{r['predicted_decode_tps']:.1f}",
                         f"{r['predicted_decode_tps'] / r['measured_decode_tps'] - 1:+.0%}") for r in rows],
                       header=("model", "batch", "prompt", "TTFT measured", "predicted", "error",
                               "decode tok/s measured", "predicted", "error")))
    return "\n".join(lines)
