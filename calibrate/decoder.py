"""A reference eager decoder in PyTorch, built from a model's shapes with random weights.

Embedding, L blocks of RMSNorm, grouped-query attention with a KV cache
(scaled_dot_product_attention), RMSNorm and a SwiGLU MLP, or for a mixture of
experts k of E SwiGLU experts per token, drawn at random as a balanced router spreads
them and weighted by the router's softmax, plus the shared experts (the first dense
layers dense), final norm and output head. Every op is
launched from Python one at a time, as Hugging Face transformers' eager models do,
and a routed expert runs on the tokens that chose it (its rows found on the device,
so the host waits for the device once per expert, as transformers' MoE loop does).

`roofline validate --local` times it at a model's real shapes; `roofline calibrate`
times it at tiny shapes, where the device work is negligible, to measure the host
time an eager step costs per layer and per routed expert (docs/formulas.md §13).
Weights are made directly on the device in its dtype, so a large model does not
wait on the CPU and nothing is downloaded.
"""

from __future__ import annotations

import math

from estimator.errors import ConfigurationError
from estimator.specs.model import Shape


def decode_matrices(s: Shape) -> tuple[tuple[int, int, int], ...]:
    """The weight matrices one decode step of a dense model streams through the decoder below: (N, K, how many)
    per distinct shape (Q, K, V and O projections, the SwiGLU MLP's three, the output head). A MoE model's
    experts are run on the tokens that chose them, not as one skinny GEMM per matrix, so it has none here."""
    if s.moe is not None:
        return ()
    d, q, kv, width, L = (s.hidden_size, s.num_attention_heads * s.head_dim, s.num_kv_heads * s.head_dim,
                          s.intermediate_size, s.num_layers)
    counts: dict[tuple[int, int], int] = {}
    for n, k, per_layer in ((q, d, 1), (kv, d, 2), (d, q, 1), (width, d, 2), (d, width, 1)):
        counts[(n, k)] = counts.get((n, k), 0) + per_layer * L
    counts[(s.vocab_size, d)] = counts.get((s.vocab_size, d), 0) + 1
    return tuple((n, k, c) for (n, k), c in counts.items())


def build_decoder(torch, s: Shape, device: str, dtype, name: str = "this model"):
    """A random-weight decoder with the shapes ``s``; returns (forward, new_cache)."""
    if s.mla is not None:
        raise ConfigurationError(f"--local builds GQA decoders (dense or MoE); {name} uses MLA attention")
    extras = [words for words, used in (
        ("Gated DeltaNet layers", s.linear_attention), ("sparse attention", s.sparse_attention),
        ("per-layer embeddings", s.per_layer_embeddings), ("KV-cache sharing", s.num_kv_shared_layers),
        ("AltUp", s.altup_num_inputs > 1), ("LAuReL", s.laurel_rank), ("an attention output gate",
                                                                       s.attention_output_gate)) if used]
    if extras:
        raise ConfigurationError(f"--local builds plain GQA decoders (dense or MoE); {name} uses "
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
        scores = torch.softmax(F.linear(flat, w["router"]).float(), -1)
        # a trained router spreads tokens over the experts (the estimate's uniform routing); a random one
        # would not: random layers make a prompt's tokens alike (attention averages them), and a 512-token
        # prompt of Qwen3-30B-A3B's shapes reached 20-25 of 128 experts per layer past the first few. So each
        # token draws its k experts at random; the router's matmul and softmax still run, and weight them.
        draw = torch.rand(scores.shape, generator=g, device=scores.device)
        chosen = torch.topk(draw, s.moe.experts_per_token).indices
        weights = scores.gather(-1, chosen)
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
