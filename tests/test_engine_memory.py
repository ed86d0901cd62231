"""How engines hold a prompt's workspace and their weights (docs/formulas.md §3).

Each case is a published run the estimator used to call "does not fit": llama.cpp sizes its compute buffer
for one micro-batch of n_ubatch tokens and keeps the input embedding on the host; ExLlamaV2 runs a long
prompt in passes of max_input_len tokens.
"""

from __future__ import annotations

import json

import pytest

from estimator import estimate
from estimator.efficiency.engine_profiles import EngineProfile
from estimator.efficiency.engine_profiles import engine as engine_named
from estimator.units import GB
from tests.helpers import cli

LLAMA3_8B = {"hidden": 4096, "ffn": 14336, "heads": 32, "vocab": 128256}


def _unfused(engine: str | EngineProfile, gpu: str, model="llama-3-8b", fmt="Q4_K_M", prompt=8192):
    return estimate(model, gpu, engine=engine, weight_format=fmt, prompt_tokens=prompt, output_tokens=1,
                    attention="unfused", calibration="none")


def test_llama_cpp_holds_one_micro_batch_of_an_unfused_prompt():
    """Llama-3-8B Q4_K_M, an 8,192-token prompt without flash attention, on an 8 GB RTX 3070: llama-bench ran
    it (xiongjiedai/GPU-Benchmarks-on-LLM-Inference, pp8192). A pass holds 512 queries against 8,192 keys,
    in fp32: 32 · 512 · 8192 · 4 B = 537 MB of scores, not the 8.6 GB of one 8,192 × 8,192 pass."""
    m = LLAMA3_8B
    e = _unfused("llama.cpp", "rtx 3070")
    matmul_outputs = 512 * (2 * m["hidden"] + 2 * m["ffn"]) * 2   # the widest output: gate and up together
    scores = m["heads"] * 512 * 8192 * 4
    logits = m["vocab"] * 4
    assert e.results["memory_activation_bytes"] == pytest.approx(matmul_outputs + scores + logits, rel=1e-9)
    assert e.results["fits"]
    whole = _unfused("generic", "rtx 3070")   # an engine that runs the whole prompt in one pass
    assert whole.results["memory_activation_bytes"] > 8 * GB and not whole.results["fits"]


def test_llama_cpp_keeps_an_untied_input_embedding_on_the_host():
    """gpt-oss-20b MXFP4 (12.1 GB of weights) on a 12 GB RTX 3060 ran (geerlingguy/ai-benchmarks): its
    201,088 × 2,880 input embedding stays in host memory. A tied embedding is also the output head, which the
    device holds, so a tied model's device weights do not change."""
    for model, tied in (("llama-3-8b", False), ("qwen2.5-0.5b", True)):
        on_device, on_host = (estimate(model, "rtx 4090", engine=name, weight_format="Q8_0", calibration="none")
                              for name in ("generic", "llama.cpp"))
        saved = on_device.results["memory_weights_bytes"] - on_host.results["memory_weights_bytes"]
        if tied:
            assert saved == pytest.approx(0.0, abs=1.0)
        else:   # V · d at Q8_0's 8.5 bits
            assert saved == pytest.approx(LLAMA3_8B["vocab"] * LLAMA3_8B["hidden"] * 8.5 / 8, rel=1e-6)
    gpt_oss = estimate("gpt-oss-20b", "rtx 3060", engine="llama.cpp", weight_format="MXFP4_MOE",
                       prompt_tokens=1, output_tokens=128, calibration="none")
    assert gpt_oss.results["fits"]


def test_exllamav2_runs_a_long_prompt_in_passes_of_max_input_len():
    """Llama-3-8B EXL2 8 bpw, a 16k prompt without flash attention, on a 24 GB RTX 4090 (matt-c1's speed
    measurements): ExLlamaV2 feeds at most max_input_len = 2,048 tokens a pass, and its attention without
    flash-attn (PyTorch's memory-efficient SDPA) holds no scores, so the workspace is one pass's activations.
    A matmul-and-softmax attention in the same passes would hold 2,048 queries' scores against the prompt's
    keys."""
    e = _unfused("ExLlamaV2", "rtx 4090", fmt="exl2-8bpw", prompt=15998)
    scores = LLAMA3_8B["heads"] * 2048 * 15998 * 4
    assert e.results["memory_activation_bytes"] < 0.2 * GB and e.results["fits"]
    profile = engine_named("ExLlamaV2")
    matmul = profile.model_copy(update={"parameters": profile.parameters.model_copy(
        update={"nonflash_scores_on_chip": False})})
    held = _unfused(matmul, "rtx 4090", fmt="exl2-8bpw", prompt=15998).results["memory_activation_bytes"]
    assert scores < held < scores + 0.2 * GB


def test_an_apple_gpu_reserves_macos_share_once(capsys):
    """Llama-3-8B Q4_K_M on an 8 GB M1 ran (xiongjiedai, pp512 and tg512). Metal's working-set limit already
    leaves macOS its share, so an Apple chip reserves only the runtime's 0.5 GiB inside it; a Linux SoC keeps
    2 GiB for its operating system."""
    apple = _unfused("llama.cpp", "Apple M1 (7-core GPU)", prompt=512)
    spark = _unfused("llama.cpp", "dgx spark", prompt=512)
    assert apple.results["memory_reserve_bytes"] == pytest.approx(0.5 * 2**30)
    assert spark.results["memory_reserve_bytes"] == pytest.approx(2 * 2**30)
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3-8b", "--gpu", "Apple M1 (7-core GPU)", "--memory-gib",
                       "8", "--engine", "llama.cpp", "--format", "Q4_K_M", "--prompt", "512", "--output", "1", "--json")
    assert code == 0 and json.loads(out)["fits"]


def test_the_micro_batch_is_a_flag_of_the_engines_that_use_it(capsys):
    """--ubatch-size sizes llama.cpp's prompt workspace (and says so in the commands to measure it); an engine
    that runs whole prompts has no micro-batch, so the flag is refused rather than ignored."""
    args = ["estimate", "--model", "llama-3-8b", "--gpu", "rtx 3070", "--format", "Q4_K_M", "--prompt", "8192",
            "--attention", "unfused", "--json"]
    small, large = (json.loads(cli(capsys, *args, "--engine", "llama.cpp", "--ubatch-size", n)[1])
                    for n in ("512", "2048"))
    growth = LLAMA3_8B["heads"] * (2048 - 512) * 8192 * 4
    assert large["memory_activation_bytes"] - small["memory_activation_bytes"] > growth
    assert small["fits"] and not large["fits"]   # 2.3 GB of workspace no longer fits beside 5.8 GB of weights and KV
    code, out, err = cli(capsys, *args, "--engine", "vllm", "--ubatch-size", "2048")
    assert code == 2 and not out and "--ubatch-size" in err and "Traceback" not in err
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3-8b", "--gpu", "rtx 3070", "--engine", "llama.cpp",
                       "--format", "Q4_K_M", "--ubatch-size", "1024")
    assert code == 0 and "-b 2048 -ub 1024 " in out


# vLLM's own logs on an H100 (79.18 GiB) at gpu_memory_utilization 0.9, max_model_len 16,000: "Available KV cache
# memory" in GiB (the published logs docs/formulas.md §3 cites)
VLLM_H100_KV_GIB = [("llama-3.1-8b", "bf16", 1, 51.38), ("Qwen/Qwen3-0.6B", "bf16", 1, 64.45),
                    ("Qwen/Qwen3-32B", "bf16", 1, 4.45), ("Qwen/Qwen3-32B", "bf16", 2, 34.49),
                    ("gpt-oss-20b", "mxfp4-experts", 1, 50.28), ("gpt-oss-120b", "mxfp4-experts", 1, 3.33),
                    ("llama-3.3-70b", "fp8", 2, 32.0)]


@pytest.mark.parametrize("model, fmt, tp, logged_gib", VLLM_H100_KV_GIB)
def test_vllm_keeps_its_sampler_warm_up_from_the_cache(model, fmt, tp, logged_gib):
    """vLLM sizes its cache after a profile run that also samples one token for each of its 1,024 requests on a
    large device, with top-k and top-p set: about 38.7 bytes a logit, 4.76 GiB for Llama-3.1-8B's 128,256-token
    vocabulary, 7.38 for gpt-oss's 201,088, on every tensor-parallel rank. With it the cache the estimate leaves
    is within 0.6 GiB of vLLM's log on each of seven configurations; without it Qwen3-32B on one H100 got twice
    the 4.45 GiB vLLM gives it."""
    e = estimate(model, "H100 SXM", engine="vLLM@0.11.0", weight_format=fmt, n_gpus=tp, prompt_tokens=15000,
                 output_tokens=1000, calibration="none")
    r = e.results
    room = r["memory_available_bytes"] - r["memory_weights_bytes"] - r["memory_reserve_bytes"] \
        - r["memory_activation_bytes"]
    assert room / 2**30 == pytest.approx(logged_gib, abs=0.6)
    assert r["memory_activation_bytes"] == pytest.approx(38.7 * 1024 * e.model.shape.vocab_size, rel=1e-9)


def test_vllm_before_0_10_sized_its_cache_without_the_warm_up():
    """io.net's vLLM 0.8.5 ran Llama-3-70B in 16 bits on 2 H100 PCIe with about 40 requests at once; with the
    4.7 GiB warm-up beside 65.7 GiB of weights a GPU would hold one 2,048-token sequence, without it 15. The
    release's runtime (v1-0.8) reserves none of it, and only the prefill workspace stays."""
    common = {"weight_format": "f16", "n_gpus": 2, "prompt_tokens": 2000, "output_tokens": 48, "calibration": "none"}
    old, new = (estimate("llama-3-70b", "h100 pcie", engine=f"vLLM@{v}", **common) for v in ("0.8.5", "0.11.0"))
    assert old.results["max_batch"] >= 8 > new.results["max_batch"]
    assert old.results["memory_activation_bytes"] < 0.5 * new.results["memory_activation_bytes"]
