"""Microbenchmarks: each returns one raw measurement as a dict (or raises; the runner records errors).

Conventions: bytes are counted as STREAM does (a copy moves its bytes twice,
read and write; a reduction once); a matmul [M,K]x[K,N] is 2·M·N·K FLOPs;
inputs are random (never zeros, which some hardware compresses), rotated over
several buffers whose total exceeds the last-level cache, and every result is
checked against a reference before its timing is kept.
"""

from __future__ import annotations

import math

from calibrate.timing import measure

DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}


class Skipped(RuntimeError):
    """A benchmark that does not apply to this machine (recorded with its reason, not as a failure)."""


class CheckFailed(RuntimeError):
    """A kernel's result differed from its reference: its timing is not trusted."""


def _dtype(torch, name: str):
    return getattr(torch, DTYPE_NAMES[name])


def _rotation(size_bytes: float, llc_bytes: float, budget_bytes: float, most: float = 8) -> int:
    """Buffers to cycle through so that repeated runs miss the cache (up to ``most``, within the memory budget)."""
    wanted = math.ceil(2 * llc_bytes / size_bytes) + 1
    return int(max(1, min(most, wanted, budget_bytes // (2 * size_bytes))))


def bandwidth(torch, device, size_bytes, *, llc_bytes, budget_bytes, reps=10) -> dict:
    """Read-only reduction and copy bandwidth at one transfer size."""
    n = int(size_bytes // 4)
    k = _rotation(n * 4, llc_bytes, budget_bytes)
    srcs = [torch.randn(n, device=device) for _ in range(k)]
    dsts = [torch.empty(n, device=device) for _ in range(k)]
    dsts[0].copy_(srcs[0])
    if not torch.equal(dsts[0], srcs[0]):
        raise CheckFailed("copy result differs from its source")
    reference = float(srcs[0].double().sum())
    if not math.isclose(float(srcs[0].sum()), reference, rel_tol=1e-3, abs_tol=1e-2 * math.sqrt(n)):
        raise CheckFailed("reduction result differs from a float64 reference")
    read = measure(torch, device, lambda i: srcs[i % k].sum(), reps=reps)
    copy = measure(torch, device, lambda i: dsts[i % k].copy_(srcs[i % k]), reps=reps)
    return {"size_bytes": float(n * 4), "buffers": k, "read": read.as_dict(), "copy": copy.as_dict(),
            "read_bytes_per_s": n * 4 / read.median_s, "copy_bytes_per_s": 2 * n * 4 / copy.median_s}


def _low_precision_matmul(torch, dtype, x, w):
    """x @ wᵀ in fp8 (scaled) or int8 on CUDA; float dtypes use the plain matmul."""
    if dtype == "fp8":
        one = torch.tensor(1.0, device=x.device)
        return torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    if dtype == "int8":
        return torch._int_mm(x, w.t())
    return x @ w.t()


def _operands(torch, device, dtype, m, n, k):
    if dtype == "fp8":
        return (torch.randn(m, k, device=device).to(torch.float8_e4m3fn),
                torch.randn(n, k, device=device).to(torch.float8_e4m3fn))
    if dtype == "int8":
        return (torch.randint(-8, 8, (m, k), device=device, dtype=torch.int8),
                torch.randint(-8, 8, (n, k), device=device, dtype=torch.int8))
    return (torch.randn(m, k, device=device, dtype=_dtype(torch, dtype)),
            torch.randn(n, k, device=device, dtype=_dtype(torch, dtype)))


# torch._int_mm takes only more than 16 rows (seen on an H200 with torch 2.11: "self.size(0) needs to be
# greater than 16"); fewer rows would time a padded product, so they are skipped and said so
INT8_MIN_ROWS = 17


def matmul(torch, device, dtype, m, n, k, *, llc_bytes, budget_bytes, reps=10) -> dict:
    """y = x · Wᵀ with x [m, k] and W [n, k]: skinny (decode) or square (prefill) shapes."""
    if dtype == "int8" and m < INT8_MIN_ROWS:
        raise Skipped(f"torch._int_mm takes more than 16 rows, not {m}")
    weight_bytes = n * k * ELEMENT_BYTES[dtype]
    # as many weight copies as it takes to pass twice the last-level cache, however small the matrix: decode
    # streams its weights from memory, and eight copies of a 4 MB matrix fit a 32 MB cache (docs/formulas.md §13)
    copies = _rotation(weight_bytes, llc_bytes, budget_bytes, most=math.inf)
    pairs = [_operands(torch, device, dtype, m, n, k) for _ in range(copies)]
    x, w = pairs[0]
    got = _low_precision_matmul(torch, dtype, x, w).float()
    want = x.float() @ w.float().t()
    tolerance = 1e-4 if dtype == "fp32" else 3e-2
    if not torch.allclose(got, want, rtol=tolerance, atol=tolerance * math.sqrt(k) * float(want.abs().mean() + 1)):
        raise CheckFailed(f"{dtype} matmul differs from an fp32 reference")
    t = measure(torch, device, lambda i: _low_precision_matmul(torch, dtype, *pairs[i % copies]), reps=reps)
    moved = weight_bytes + (m * k + m * n) * ELEMENT_BYTES[dtype]
    return {"dtype": dtype, "m": m, "n": n, "k": k, "buffers": copies, **t.as_dict(),
            "flops_per_s": 2 * m * n * k / t.median_s, "bytes_per_s": moved / t.median_s}


def attention(torch, device, dtype, seq, *, heads=8, head_dim=128, reps=5) -> dict:
    """Causal fused attention (scaled_dot_product_attention) for one sequence."""
    import torch.nn.functional as F
    q, k, v = (torch.randn(1, heads, seq, head_dim, device=device, dtype=_dtype(torch, dtype)) for _ in range(3))
    small = slice(0, min(seq, 64))
    got = F.scaled_dot_product_attention(q[:, :, small], k[:, :, small], v[:, :, small], is_causal=True).float()
    scores = (q[:, :, small].float() @ k[:, :, small].float().transpose(-1, -2)) / math.sqrt(head_dim)
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=device).tril()
    want = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v[:, :, small].float()
    if not torch.allclose(got, want, rtol=5e-2, atol=5e-2):
        raise CheckFailed("scaled_dot_product_attention differs from an explicit reference")
    t = measure(torch, device, lambda i: F.scaled_dot_product_attention(q, k, v, is_causal=True), reps=reps)
    flops = 4 * heads * head_dim * seq * (seq + 1) / 2
    return {"dtype": dtype, "seq": seq, "heads": heads, "head_dim": head_dim, **t.as_dict(),
            "flops_per_s": flops / t.median_s}


def kv_expand(torch, device, dtype, size_bytes, *, llc_bytes, budget_bytes, group=4, kv_heads=8, head_dim=128,
              reps=10) -> dict:
    """Grouped keys copied out to one head per query head, as Hugging Face's repeat_kv does before attention.

    A cache slice of ``size_bytes`` (batch 16, 8 KV heads of 128, its length the rest) is expanded ``group``
    times with repeat_interleave over the head axis, as the reference decoder (calibrate/decoder.py) does every
    layer; bytes moved count the compact read and the expanded write. The slice leaves room in the cache for
    the tokens still to come, as a decode step's does, so the copy reads strided rows."""
    batch, element = 16, ELEMENT_BYTES[dtype]
    seq = max(1, int(size_bytes // (batch * kv_heads * head_dim * element)))
    k = _rotation(size_bytes * (1 + group), llc_bytes, budget_bytes)
    caches = [torch.randn(batch, kv_heads, seq + 16, head_dim, device=device, dtype=_dtype(torch, dtype))
              for _ in range(k)]
    views = [c[:, :, :seq] for c in caches]
    want = views[0][:, :, None].expand(batch, kv_heads, group, seq, head_dim).reshape(batch, -1, seq, head_dim)
    if not torch.equal(views[0].repeat_interleave(group, 1), want):
        raise CheckFailed("repeat_interleave differs from an expanded view of its input")
    t = measure(torch, device, lambda i: views[i % k].repeat_interleave(group, 1), reps=reps)
    compact = batch * kv_heads * seq * head_dim * element
    return {"dtype": dtype, "group": group, "buffers": k, "compact_bytes": float(compact), **t.as_dict(),
            "bytes_per_s": (1 + group) * compact / t.median_s}


def launch_overhead(torch, device, reps=20) -> dict:
    """A 1-element in-place add: the cost of launching one tiny kernel."""
    x = torch.zeros(1, device=device)
    t = measure(torch, device, lambda i: x.add_(1.0), reps=reps, inner=100)
    return {**t.as_dict(), "per_op_s": t.median_s}


def small_op_chain(torch, device, reps=20, ops=12) -> dict:
    """A chain of small ops shaped like a tiny model's decode step (norm, projections, residual)."""
    h = torch.randn(1, 256, device=device)
    w = torch.randn(256, 256, device=device)

    def step(_):
        y = h
        for _ in range(ops // 4):
            y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
            y = y @ w
            y = torch.nn.functional.silu(y)
            y = y + h
        return y
    t = measure(torch, device, step, reps=reps)
    return {**t.as_dict(), "ops": ops, "per_op_s": t.median_s / ops}


def sync_overhead(torch, device, reps=20) -> dict:
    """torch.cuda.synchronize() on an idle device."""
    t = measure(torch, device, lambda i: torch.cuda.synchronize(), reps=reps, inner=50)
    return {**t.as_dict(), "per_sync_s": t.median_s}


# The reference decoder at tiny shapes: a step's device work is a few microseconds, so its time is the host's.
TINY_DECODER = {"hidden_size": 64, "num_attention_heads": 4, "num_kv_heads": 2, "head_dim": 16,
                "intermediate_size": 128, "vocab_size": 256, "tie_word_embeddings": False, "max_context": 256}
TINY_EXPERTS = 8
EAGER_DEPTHS = (2, 10)


def eager_host(torch, device, dtype, reps=10) -> dict:
    """Host time of an eager decode step per layer, and per routed expert a MoE layer runs.

    The reference decoder (calibrate/decoder.py) decodes one token at tiny shapes, at two depths, dense and
    as a MoE with all 8 of 8 experts routed; the slope over depth is the time per layer, and the MoE layer's
    excess over the dense one, over its 8 experts, the time per expert (router and all)."""
    from calibrate.decoder import build_decoder
    from estimator.specs.model import MoE, Shape

    def step_s(moe, layers):
        forward, new_cache = build_decoder(torch, Shape(**TINY_DECODER, num_layers=layers, moe=moe), device,
                                           _dtype(torch, dtype))
        cache, token = new_cache(1, 64), torch.zeros(1, 1, dtype=torch.long, device=device)
        with torch.inference_mode():
            return measure(torch, device, lambda i: forward(token, cache, 32), reps=reps).median_s

    moe = MoE(num_experts=TINY_EXPERTS, experts_per_token=TINY_EXPERTS, expert_intermediate_size=32)
    (dense_lo, dense_hi), (moe_lo, moe_hi) = ([step_s(m, n) for n in EAGER_DEPTHS] for m in (None, moe))
    layers = EAGER_DEPTHS[1] - EAGER_DEPTHS[0]
    per_layer, per_moe_layer = (dense_hi - dense_lo) / layers, (moe_hi - moe_lo) / layers
    return {"dtype": dtype, "depths": list(EAGER_DEPTHS), "dense_step_s": [dense_lo, dense_hi],
            "moe_step_s": [moe_lo, moe_hi], "per_layer_s": per_layer,
            "per_expert_s": (per_moe_layer - per_layer) / TINY_EXPERTS}


def host_transfer(torch, device, size_bytes, *, pinned: bool, to_device: bool, reps=10) -> dict:
    """Host-to-device or device-to-host copy bandwidth, pinned or pageable host memory."""
    n = int(size_bytes // 4)
    host = torch.randn(n, pin_memory=pinned) if pinned else torch.randn(n)
    dev = torch.empty(n, device=device)
    dev.copy_(host)
    if not torch.equal(dev.cpu(), host):
        raise CheckFailed("host transfer corrupted its data")
    fn = (lambda i: dev.copy_(host, non_blocking=pinned)) if to_device else (lambda i: host.copy_(dev))
    t = measure(torch, device, fn, reps=reps)
    return {"size_bytes": float(n * 4), "pinned": pinned, "to_device": to_device, **t.as_dict(),
            "bytes_per_s": n * 4 / t.median_s}


def peer_transfer(torch, size_bytes, reps=10) -> dict:
    """Device 0 to device 1 copy bandwidth (NVLink or PCIe); on a single GPU it is skipped, and says so."""
    if torch.cuda.device_count() < 2:
        raise Skipped(f"one GPU visible ({torch.cuda.device_count()}): no peer to copy to")
    n = int(size_bytes // 4)
    a = torch.randn(n, device="cuda:0")
    b = torch.empty(n, device="cuda:1")
    b.copy_(a)
    if not torch.equal(b.cpu(), a.cpu()):
        raise CheckFailed("peer copy corrupted its data")
    t = measure(torch, "cuda", lambda i: b.copy_(a), reps=reps)
    return {"size_bytes": float(n * 4), **t.as_dict(), "bytes_per_s": n * 4 / t.median_s}
