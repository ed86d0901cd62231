"""What an eager engine moves beyond a fused one (docs/formulas.md §13): grouped KV heads copied out per query head
before attention (Hugging Face's repeat_kv, ExLlamaV2 without flash-attn), a quantized cache widened to 16 bits
before attention reads it (ExLlamaV2), and a pass of its own for each elementwise op; the traffic each adds, the
rate it runs at, and the H200 and RTX 4090 measurements they explain."""

from __future__ import annotations

from pathlib import Path

import pytest

from estimator.efficiency.calibration_profile import load_profile
from estimator.efficiency.defaults import GENERIC_ENGINE
from estimator.efficiency.engine_profiles import engine, load_engines
from estimator.efficiency.rates import effective_rates
from estimator.evaluation.api import estimate, resolve_model
from estimator.evaluation.columns import compute_peak_table, format_columns, hardware_columns, model_columns
from estimator.physics import traffic as tr
from estimator.physics.roofline import pass_time
from estimator.specs.database import load_database
from estimator.specs.formats import weight_format

H200_PROFILE = Path(__file__).parents[1] / "hardware_db/calibrations/nvidia-h200-sxm-141gb-vm.yaml"
BF16 = {"dense_bits": 16.0, "expert_bits": 16.0, "head_bits": 16.0, "embedding_bits": 16.0}


@pytest.fixture(scope="module")
def llama():
    """Llama-3.1-8B's columns: 32 query heads over 8 KV heads of 128, 32 layers."""
    return model_columns([resolve_model("llama-3.1-8b", load_database()).require_modelled()])


def test_the_expansion_is_the_query_heads_per_kv_head_where_the_engine_expands(llama):
    assert float(tr.kv_head_expansion(llama, True)[0]) == 4.0
    assert float(tr.kv_head_expansion(llama, False)[0]) == 1.0
    deepseek = model_columns([resolve_model("deepseek-v3", load_database()).require_modelled()])
    assert float(tr.kv_head_expansion(deepseek, True)[0]) == 1.0     # an MLA latent is not a grouped head


def test_a_decode_step_reads_the_cache_one_plus_two_g_times_by_hand(llama):
    """64 sequences at 520 tokens: the compact cache is 64 x 520 x 32 layers x (2 x 8 x 128 x 2 B) = 4.36 GB;
    the copy reads it and writes it 4 times over (21.8 GB), attention reads the copy (17.4 GB)."""
    compact = 64 * 520 * 32 * 2 * 8 * 128 * 2
    plain = tr.decode_bytes(llama, BF16, 16, 64, 520.0, 520.0, 1, True)
    expanded = tr.decode_bytes(llama, BF16, 16, 64, 520.0, 520.0, 1, True, expansion=4.0)
    assert float(plain["kv_read"][0]) == compact and float(plain["kv_expand"][0]) == 0
    assert float(expanded["kv_read"][0]) == 4 * compact
    assert float(expanded["kv_expand"][0]) == 5 * compact
    for key in ("weights", "kv_write", "activations", "attention"):
        assert float(expanded[key][0]) == float(plain[key][0])


def test_a_prefill_copies_the_whole_prompt_cache_out_in_every_layer(llama):
    """8 prompts of 2,048 tokens: each layer copies its 8 x 2,048 x 4 KiB cache out 4 times."""
    compact = 8 * 2048 * 32 * 2 * 8 * 128 * 2
    plain = tr.prefill_bytes(llama, BF16, 16, 8, 2048.0, 1, True)
    expanded = tr.prefill_bytes(llama, BF16, 16, 8, 2048.0, 1, True, expansion=4.0)
    assert float(expanded["kv_expand"][0]) == 5 * compact and float(plain["kv_expand"][0]) == 0
    assert float(expanded["attention"][0]) > float(plain["attention"][0])     # its tiles re-read the copy


def test_a_widened_cache_is_read_compact_written_wide_and_attended_wide_by_hand(llama):
    """The same 64 sequences with a 4.5-bit cache widened to 16 bits first: the copy reads the compact cache (1.23
    GB) and writes the wide one (4.36 GB), attention reads the wide one; with grouped heads expanded 4 times on top,
    the expansion copies from the wide entries: 1.23 + 4.36 + 5 x 4.36 GB of copies and 4 x 4.36 GB read."""
    wide = 64 * 520 * 32 * 2 * 8 * 128 * 2
    compact = wide * 4.5 / 16
    read_as_stored = tr.decode_bytes(llama, BF16, 4.5, 64, 520.0, 520.0, 1, True)
    widened = tr.decode_bytes(llama, BF16, 4.5, 64, 520.0, 520.0, 1, True, attended_bits=16)
    both = tr.decode_bytes(llama, BF16, 4.5, 64, 520.0, 520.0, 1, False, expansion=4.0, attended_bits=16)
    assert float(read_as_stored["kv_read"][0]) == pytest.approx(compact) and float(read_as_stored["kv_expand"][0]) == 0
    assert float(widened["kv_read"][0]) == pytest.approx(wide)
    assert float(widened["kv_expand"][0]) == pytest.approx(compact + wide)
    assert float(both["kv_read"][0]) == pytest.approx(4 * wide)
    assert float(both["kv_expand"][0]) == pytest.approx(compact + wide + 5 * wide)
    assert float(widened["kv_write"][0]) == float(read_as_stored["kv_write"][0])   # new entries are stored compact
    prefill = tr.prefill_bytes(llama, BF16, 4.5, 8, 2048.0, 1, True, attended_bits=16)
    assert float(prefill["kv_expand"][0]) == pytest.approx(8 * 2048 * 32 * 2 * 8 * 128 * (4.5 + 16) / 8)


def test_the_copy_runs_at_its_own_rate():
    """1 GB of weights at 1 TB/s and 5 GB of expansion copy at 1.25 TB/s: 1 ms + 4 ms."""
    flops = {"linear": 0.0, "head": 0.0, "attention": 0.0}
    bytes_ = {"weights": 1e9, "activations": 0.0, "kv_read": 0.0, "kv_expand": 5e9, "elementwise": 0.0,
              "score_ops": 0.0}
    rates = {"linear_flops_per_s": 1e15, "attention_flops_per_s": 1e15, "weight_bytes_per_s": 1e12,
             "kv_bytes_per_s": 4e12, "kv_expand_bytes_per_s": 1.25e12, "stream_bytes_per_s": 4e12}
    assert pass_time(flops, bytes_, rates, 1.0, 0.0)["time_s"] == pytest.approx(5e-3)


def test_unfused_elementwise_bytes_by_hand():
    """Llama-3.1-8B: 32 x (48 x 4,096 + 4 x 32 x 128 + 10 x 14,336) bytes a token; Qwen3-30B-A3B (48 MoE layers,
    8 routed experts of 768): 48 x (48 x 2,048 + 4 x 32 x 128 + 10 x 8 x 768)."""
    db = load_database()
    llama, qwen = (model_columns([resolve_model(name, db).require_modelled()])
                   for name in ("llama-3.1-8b", "qwen3-30b-a3b"))
    assert float(llama["unfused_elementwise_bytes_per_token"][0]) == 32 * (48 * 4096 + 4 * 4096 + 10 * 14336)
    assert float(qwen["unfused_elementwise_bytes_per_token"][0]) == 48 * (48 * 2048 + 4 * 4096 + 10 * 8 * 768)
    assert float(tr.prefill_bytes(llama, BF16, 16, 2, 100.0, 1, True, unfused_ops=True)["elementwise"][0]) \
        == 200 * 32 * (48 * 4096 + 4 * 4096 + 10 * 14336)
    assert float(tr.prefill_bytes(llama, BF16, 16, 2, 100.0, 1, True)["elementwise"][0]) == 0


def test_elementwise_passes_add_to_compute_bound_linear_layers():
    """A compute-bound pass (1 PFLOP at 1 PFLOP/s) with 4 TB of unfused passes at 4 TB/s: 1 s + 1 s."""
    flops = {"linear": 1e15, "head": 0.0, "attention": 0.0}
    bytes_ = {"weights": 1e9, "activations": 0.0, "kv_expand": 0.0, "elementwise": 4e12, "score_ops": 0.0}
    rates = {"linear_flops_per_s": 1e15, "attention_flops_per_s": 1e15, "weight_bytes_per_s": 1e12,
             "kv_bytes_per_s": 1e12, "kv_expand_bytes_per_s": 1e12, "stream_bytes_per_s": 4e12}
    parts = pass_time(flops, bytes_, rates, 1.0, 0.0)
    assert parts["time_s"] == pytest.approx(2.0) and parts["linear_s"] == pytest.approx(2.0)


def _copy_rate(gpu):
    device = load_database().hardware.get(gpu)
    fmts = [weight_format("bf16")]
    peaks, _ = compute_peak_table(fmts, [device])
    return float(effective_rates(hardware_columns([device]), format_columns(fmts), peaks[:, 0],
                                 GENERIC_ENGINE)["kv_expand_bytes_per_s"][0])


def test_without_a_calibration_the_copy_runs_at_its_index_arithmetic_or_memory_rate():
    """The copy's per-element indexing bounds it at 0.0183 bytes per FP32 FLOP (the H200's measured 1.23 TB/s over
    its 67 TFLOPS): an H200 copies at that 1.23 TB/s; an RTX 4090's 82.6 TFLOPS would allow 1.52 TB/s, so its
    memory binds (1,008 GB/s x the GDDR default 0.9)."""
    assert _copy_rate("h200") == pytest.approx(1.229e12)
    assert _copy_rate("rtx 4090") == pytest.approx(1008e9 * 0.9, rel=0.05)
    assert _copy_rate("rtx 4090") < 1.229e12 / 67e12 * 82.6e12


def test_exllamav2_copies_its_cache_where_its_code_does():
    """ExLlamaV2 expands grouped heads only without flash-attn (repeat_kv in _attn_torch and _attn_xformers) and
    widens only a quantized cache (q_to_fp16_kv); the eager reference decoder expands whatever the attention."""
    args = {"weight_format": "exl2-8bpw", "prompt_tokens": 4096, "output_tokens": 64}
    copies = {(kv, attention): estimate("llama-3-8b", "rtx 4090", engine="exllamav2", kv_format=kv,
                                        attention=attention, **args).results["decode_bytes_kv_expand"]
              for kv in ("f16", "q4") for attention in ("fused", "unfused")}
    assert copies["f16", "fused"] == 0
    assert 0 < copies["q4", "fused"] < copies["f16", "unfused"] < copies["q4", "unfused"]
    assert estimate("llama-3-8b", "rtx 4090", engine="pytorch-eager", weight_format="bf16", attention="fused",
                    prompt_tokens=4096, output_tokens=64).results["decode_bytes_kv_expand"] > 0


def test_the_copies_explain_exllamav2_decode_at_16k_tokens():
    """measurements_db/exllama-mlc.csv (matt-c1's RTX 4090 runs of Llama-3-8B at 8 bpw, 16k-token prompts): decode at
    67.5 tok/s with an FP16 cache and flash-attn, 56.1 with the Q4 cache, 30.1 without flash-attn, 27.6 with
    both. Read as stored, the Q4 cache would decode faster than the FP16 one (its reads are 3.6x smaller) and the
    path without flash-attn as fast as with it: the copies reverse both and bring each within 15%."""
    args = {"weight_format": "exl2-8bpw", "prompt_tokens": 15985, "output_tokens": 257}
    measured = {("f16", "fused"): 67.47, ("q4", "fused"): 56.08, ("f16", "unfused"): 30.10, ("q4", "unfused"): 27.59}
    predicted = {key: estimate("llama-3-8b", "rtx 4090", engine="exllamav2", kv_format=key[0], attention=key[1],
                               **args).decode_tps_per_seq for key in measured}
    for key, tps in measured.items():
        assert predicted[key] == pytest.approx(tps, rel=0.15), key
    profile = engine("exllamav2")
    as_stored = profile.model_copy(update={"parameters": profile.parameters.model_copy(
        update={"expands_grouped_kv": "never", "dequantizes_kv_cache": False})})
    plain = {key: estimate("llama-3-8b", "rtx 4090", engine=as_stored, kv_format=key[0], attention=key[1],
                           **args).decode_tps_per_seq for key in measured}
    assert plain["q4", "fused"] > plain["f16", "fused"] and plain["f16", "unfused"] > 1.5 * measured["f16", "unfused"]


def test_exllamav2_without_flash_attn_writes_no_scores():
    """ExLlamaV2's attention without flash-attn is PyTorch's memory-efficient SDPA (or xformers): its workspace holds
    no score matrix and its prompt moves the expanded K/V tiles, where llama.cpp's matmul-and-softmax path writes
    the scores. matt-c1's RTX 4090 prompts of Llama-3-8B without flash-attn (measurements_db/exllama-mlc.csv):
    7,184 tok/s at 8.6k tokens and 5,259 at 16k, each within 15%."""
    def run(name, fmt, attention, prompt):
        return estimate("llama-3-8b", "rtx 4090", engine=name, weight_format=fmt, attention=attention,
                        prompt_tokens=prompt, output_tokens=1)
    exl = {a: run("exllamav2", "exl2-8bpw", a, 15985) for a in ("fused", "unfused")}
    lcpp = {a: run("llama.cpp", "Q8_0", a, 15985) for a in ("fused", "unfused")}
    assert exl["unfused"].results["memory_activation_bytes"] == exl["fused"].results["memory_activation_bytes"]
    assert lcpp["unfused"].results["memory_activation_bytes"] > 10 * lcpp["fused"].results["memory_activation_bytes"]
    scores = {name: r["unfused"].results["prefill_bytes_attention"] + r["unfused"].results["prefill_bytes_score_ops"]
              for name, r in (("exllamav2", exl), ("llama.cpp", lcpp))}
    assert exl["unfused"].results["prefill_bytes_score_ops"] == 0 and scores["exllamav2"] < scores["llama.cpp"] / 3
    assert exl["unfused"].results["prefill_bytes_kv_expand"] > 0     # its heads are still copied out
    for prompt, measured in ((8557, 7184), (15996, 5259)):
        assert run("exllamav2", "exl2-8bpw", "unfused", prompt).prefill_tps == pytest.approx(measured, rel=0.15)


def test_the_eager_engines_and_what_they_pay():
    """The reference decoder copies KV heads out as transformers does with a mask; transformers' generate() on
    equal-length prompts passes none and attends with enable_gqa (both measured on the H200)."""
    assert [p.name for p in load_engines() if p.parameters.expands_grouped_kv == "always"] == ["pytorch-eager"]
    assert [p.name for p in load_engines() if p.parameters.unfused_elementwise] == ["pytorch-eager", "transformers"]


def test_the_expansion_explains_the_h200_eager_decode_at_batch_64():
    """measurements_db/project-h200.csv, the run calibrated in the same VM: Llama-3.1-8B bf16 at batch 64 after a
    512-token prompt decoded at 32.97 tok/s. The copy, at the 1.23 TB/s the calibration measured, is over half
    the step; without it the estimate is over 1.5x too fast."""
    profile = load_profile(H200_PROFILE)
    assert profile.summary.kv_expand_bytes_per_s == pytest.approx(1.229e12, rel=0.01)
    args = {"weight_format": "bf16", "batch": 64, "prompt_tokens": 512, "output_tokens": 16, "calibration": profile}
    eager = estimate("llama-3.1-8b", "h200", engine="pytorch-eager", **args)
    assert eager.decode_tps_per_seq == pytest.approx(32.97, rel=0.15)
    step_s = 1 / eager.decode_tps_per_seq
    assert eager.results["decode_bytes_kv_expand"] / profile.summary.kv_expand_bytes_per_s > step_s / 2
    profile_engine = engine("pytorch-eager")
    unexpanded = profile_engine.model_copy(update={"parameters": profile_engine.parameters.model_copy(
        update={"expands_grouped_kv": "never"})})
    assert estimate("llama-3.1-8b", "h200", engine=unexpanded, **args).decode_tps_per_seq > 1.5 * 32.97


@pytest.mark.parametrize("model, batch, measured_ms", [("llama-3.1-8b", 64, 840.45), ("qwen2.5-0.5b", 64, 64.79)])
def test_unfused_passes_explain_part_of_the_h200_eager_prefill(model, batch, measured_ms):
    """The same run's TTFT at batch 64 after 512-token prompts (32,768 tokens): the unfused passes (373 GB for
    Llama-3.1-8B, 75 GB for Qwen2.5-0.5B at the 4.17 TB/s read plateau) bring the estimate within 20%, from
    25-45% fast."""
    profile = load_profile(H200_PROFILE)
    args = {"weight_format": "bf16", "batch": batch, "prompt_tokens": 512, "output_tokens": 16,
            "calibration": profile}
    ttft_ms = estimate(model, "h200", engine="pytorch-eager", **args).ttft_s * 1e3
    assert ttft_ms == pytest.approx(measured_ms, rel=0.2)
    profile_engine = engine("pytorch-eager")
    fused = profile_engine.model_copy(update={"parameters": profile_engine.parameters.model_copy(
        update={"unfused_elementwise": False})})
    fused_ms = estimate(model, "h200", engine=fused, **args).ttft_s * 1e3
    assert abs(fused_ms / measured_ms - 1) > abs(ttft_ms / measured_ms - 1) + 0.08


def test_the_estimate_lists_the_engines_own_bytes_only_where_the_engine_pays_them():
    from estimator.reporting.estimate_text import ENGINE_BYTE_TERMS, format_estimate
    args = {"weight_format": "bf16", "batch": 8, "prompt_tokens": 1024, "output_tokens": 64}
    text = {name: format_estimate(estimate("llama-3.1-8b", "h200", engine=name, **args))
            for name in ("pytorch-eager", "transformers", "vllm")}
    eager_terms = ("kv_expand", "elementwise")   # its attention is SDPA's fused kernel: no score passes
    assert all(ENGINE_BYTE_TERMS[t] in text["pytorch-eager"] for t in eager_terms)
    assert ENGINE_BYTE_TERMS["score_ops"] not in text["pytorch-eager"]
    assert ENGINE_BYTE_TERMS["elementwise"] in text["transformers"]            # no KV-head copy without a mask
    assert ENGINE_BYTE_TERMS["kv_expand"] not in text["transformers"] and "kv expand" not in text["transformers"]
    assert "kv expand" not in text["vllm"] and "elementwise" not in text["vllm"]
    exllama = format_estimate(estimate("llama-3-8b", "rtx 4090", engine="exllamav2", weight_format="exl2-8bpw",
                                       kv_format="q4", prompt_tokens=4096, output_tokens=64))
    assert ENGINE_BYTE_TERMS["kv_expand"] in exllama and "Bytes the engine's code adds" in exllama
    unfused = format_estimate(estimate("llama-3-8b", "rtx 4090", engine="llama.cpp", weight_format="Q4_K_M",
                                       attention="unfused", prompt_tokens=4096, output_tokens=64))
    assert ENGINE_BYTE_TERMS["score_ops"] in unfused
