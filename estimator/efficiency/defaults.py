"""Default efficiencies and fixed overheads: what fraction of datasheet peaks is achieved.

These are *priors*, used until a calibration profile (measured device
efficiency) or an engine profile (fitted from published measurements) replaces
them. They compose as in docs/architecture.md::

    effective_bandwidth = peak_bandwidth × device_bandwidth_eff × engine_bandwidth_eff(kernel family)
    effective_compute   = peak(compute dtype) × device_compute_eff × engine_compute_eff

Every value states its basis. They are parameters of the timing functions,
never literals inside formulas.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Annotated, Literal

import numpy as np
from pydantic import Field

from estimator.errors import load_yaml
from estimator.specs.hardware import DeviceClass, Hardware, MemoryType
from estimator.specs.sourced import Frozen
from estimator.units import GiB


class DeviceDefaults(Frozen):
    """What a device of a memory/device class delivers with good kernels (before any engine losses)."""

    bandwidth_eff: float = Field(gt=0, le=1)
    compute_eff: float = Field(gt=0, le=1)
    usable_memory_fraction: float = Field(gt=0, le=1, description="share of capacity an inference process may use")
    runtime_reserve_bytes: float = Field(ge=0, description="CUDA/driver context, library workspaces")
    basis: str


# Device groups an engine's efficiencies may differ between (its kernels are tuned for some): by market for compute
# (clocks and power limits), by memory for bandwidth (bandwidth_group).
DEVICE_GROUPS = {"datacenter": ("datacenter_gpu", "accelerator"), "desktop": ("workstation_gpu", "consumer_gpu"),
                 "unified": ("soc_unified", "cpu")}
GROUP_ORDER = tuple(DEVICE_GROUPS)
CLASS_ORDER = tuple(c.value for c in DeviceClass)


# Where MLX runs its vector decode attention (sdpa_vector; ScaledDotProductAttention::use_fallback, docs/formulas.md
# §13): the head sizes it is built for, the most new tokens a sequence, the most query rows per KV head (q·g).
VECTOR_ATTENTION_HEAD_DIMS = (64, 96, 128, 256)
VECTOR_ATTENTION_MAX_QUERY_TOKENS = 8
VECTOR_ATTENTION_MAX_QUERY_ROWS = 32


class EngineDefaults(Frozen):
    """A generic serving engine: kernel efficiencies and fixed per-step costs."""

    bandwidth_eff: dict[str, float] = Field(description="by kernel family (formats.WeightFormat.dequant)")
    kv_bandwidth_eff: float = Field(gt=0, le=2, description="decode attention reading the KV cache: a factor on "
                                                            "the device's default bandwidth efficiency, which a fit "
                                                            "keeps under 0.95 of datasheet as a product")
    compute_eff: float = Field(gt=0, le=2, description="share of the database's dense peak prefill reaches")
    native_bytes_per_s_per_sm: float | None = Field(
        default=None, gt=0, description="the most bytes a second one streaming multiprocessor reads through the "
                                        "engine's 16-bit weight kernels, where they keep a bounded number of bytes "
                                        "in flight per SM (bounded_per_sm): by Little's law they stream at the lower "
                                        "of that times the device's SMs and their share of the datasheet "
                                        "(docs/formulas.md §9); None: no such bound; fitted")
    bandwidth_scale_by_group: dict[str, float] = Field(
        default_factory=dict, description="factor on the 16/8-bit (native) bandwidth efficiency by device group "
                                          "(DEVICE_GROUPS), for engines whose kernels fare differently on, e.g., "
                                          "Metal and CUDA")
    dequant_scale_by_group: dict[str, float] = Field(
        default_factory=dict, description="the same factor for dequantizing kernels (weight-only, GGUF, FP4); "
                                          "the native one when not given")
    compute_eff_by_group: dict[str, float] = Field(
        default_factory=dict, description="overrides of compute_eff by device group (DEVICE_GROUPS). Above 1 "
                                          "where kernels use a faster path than the peak the database lists, e.g. "
                                          "FP16 accumulation on GeForce cards, whose listed peak is FP32-accumulate")
    fp4_compute_scale: float = Field(
        default=1.0, gt=0, le=1, description="the share of the FP4 tensor rate its GEMMs in FP4 (NVFP4, MXFP4 on "
                                             "Blackwell) reach, relative to the share its other GEMMs reach of "
                                             "theirs: each FP4 GEMM also quantizes its activations to FP4 blocks and "
                                             "handles their scales (docs/formulas.md §9); fitted")
    per_step_s: float = Field(ge=0, description="scheduler, sampling, launch of a forward pass")
    per_layer_s: float = Field(ge=0, description="kernel launches and synchronisation per layer")
    per_expert_s: float = Field(
        default=0.0, ge=0, description="host time per routed expert a MoE layer runs, for an engine that loops over "
                                       "the experts its tokens chose and waits on the device for each one's rows "
                                       "(eager transformers); 0 for grouped-GEMM engines")
    per_sequence_s: float = Field(
        default=0.0, ge=0, description="host time per sequence per step (scheduling, sampling, detokenizing), "
                                       "which a step pays on top of per_step_s; it grows the step with the batch")
    blocking_output_per_sequence_s: float = Field(
        default=0.0, ge=0, description="host time per sequence per step during which the device waits: an engine "
                                       "that processes a step's outputs (detokenizing, stop checks, streaming) "
                                       "before it schedules the next step pays it on top of per_sequence_s (vLLM's "
                                       "V0 engine before 0.6.0, docs/formulas.md §14); 0 where outputs are "
                                       "processed beside the next step. A property of the runtime, never fitted")
    allreduce_latency_s: float = Field(ge=0, description="fixed cost of one small tensor-parallel all-reduce")
    expert_tile_tokens: float = Field(
        default=0.0, ge=0, le=4096, description="MoE grouped GEMMs: every expert a pass touches costs at least the "
                                                "FLOPs of this many tokens (tiles of rows, routing and permutation)")
    expert_matvec_tokens: int = Field(
        default=0, ge=0, description="MoE: a pass of at most this many tokens runs each routed expert as a "
                                     "matrix-vector product, which pads no tile, so expert_tile_tokens does not "
                                     "apply to it (llama.cpp: one token, mul_mat_vec_id on every backend); a "
                                     "property of the engine's kernels, never fitted")
    expert_tile_max_tokens: int = Field(
        default=0, ge=0, description="MoE: where positive, a quantized grouped GEMM picks one tile width for the whole "
                                     "pass (its tokens rounded up to 8 or 16, at most this many) and each touched "
                                     "expert computes whole tiles, padding on top of expert_tile_tokens (llama.cpp's "
                                     "MMQ on CUDA: 128; estimator.physics.expert_tiles). A property, never fitted")
    expert_pair_reads_tokens: int = Field(
        default=1, ge=0, description="MoE: a pass of at most this many tokens reads each (token, chosen expert) "
                                     "pair's weights on its own, whatever the routing (llama.cpp on Metal: 31, "
                                     "mul_mv_id below ne21_mm_id_min = 32), beyond it each touched expert once: "
                                     "which MoE batches of synthetic token ids are judged only (docs/formulas.md "
                                     "§9). A property, never fitted")
    fp16_accumulate: bool = Field(
        default=False, description="16-bit GEMMs accumulate in FP16, which GeForce cards run at twice their listed "
                                   "(FP32-accumulate) rate (compute_ceiling); a property of the engine's kernels, "
                                   "never fitted")
    attention_fp16_accumulate_share: float = Field(
        default=1.0, ge=0, le=1, description="of attention's FLOPs, the share that accumulates in FP16 where the "
                                             "engine's 16-bit GEMMs do (fp16_accumulate); the rest runs at the "
                                             "listed FP32-accumulate rate. llama.cpp 0.5: its flash-attention "
                                             "kernels keep QKᵀ in float tiles and P·V in half2, and its unfused "
                                             "path sets GGML_PREC_F32 on QKᵀ only; a property of the engine's "
                                             "kernels, never fitted")
    torch_kernels: bool = Field(
        default=False, description="its linear layers are PyTorch's own GEMMs (eager PyTorch): a calibration's "
                                   "measured weight-stream curve is their rate, with no engine factor on top; a "
                                   "property of the engine's kernels, never fitted")
    prefill_in_ubatches: bool = Field(
        default=False, description="it runs a prompt in physical micro-batches of ubatch_tokens (llama.cpp's "
                                   "n_ubatch): a MoE prefill touches its experts once per micro-batch, so its "
                                   "grouped GEMMs pay their tile padding per micro-batch; a property, never fitted")
    expands_grouped_kv: Literal["never", "unfused", "always"] = Field(
        default="never", description="when attention expands grouped KV heads to one per query head before it "
                                     "attends (Hugging Face's repeat_kv, a repeat_interleave): always, only on its "
                                     "path without flash attention (ExLlamaV2's torch and xformers attention), or "
                                     "never; each pass then copies the cache it reads g = n_h/n_kv times over and "
                                     "attention reads the copy; a property of the engine's code, never fitted")
    broadcasts_grouped_kv: bool = Field(
        default=False, description="without flash attention its score and value matmuls broadcast each grouped KV "
                                   "head over its g = n_h/n_kv query heads (mlx-lm's hand-written attention), so "
                                   "attention reads the cache g times but copies nothing; a property of the "
                                   "engine's code, never fitted")
    bounded_per_sm: bool = Field(
        default=False, description="its 16-bit weight-streaming kernels keep a bounded number of bytes in flight "
                                   "per SM (llama.cpp's CUDA mat-vecs), so native_bytes_per_s_per_sm is fitted for "
                                   "it; a property of the engine's kernels, never fitted")
    vector_decode_attention: bool = Field(
        default=False, description="its fused attention of a decode pass is a vector kernel: every query head's "
                                   "threads score each key on the FP32 SIMD lanes, one 32-lane reduction per key "
                                   "(MLX's sdpa_vector, for up to 8 new tokens a sequence, a head size of 64, 96, "
                                   "128 or 256 and at most 32 query rows per KV head), so that attention's FLOPs "
                                   "run at vector_attention_eff of the device's FP32 peak, not at its matrix "
                                   "rate (docs/formulas.md §13); a property of the engine's code, never fitted")
    vector_attention_eff: float = Field(
        default=0.10, gt=0, le=1, description="the share of the device's FP32 peak that vector decode kernel "
                                              "(vector_decode_attention) reaches; the default is the order of "
                                              "MLX's published timings of it, 0.07-0.19 on three Apple GPUs "
                                              "(docs/formulas.md §13); fitted")
    score_bits: Literal[16, 32] = Field(
        default=16, description="bits of a score element each pass of its unfused attention moves: 32 where the "
                                "score matmul writes F32 (llama.cpp: ggml_mul_mat's result is F32, and its softmax "
                                "keeps it), 16 where scores stay in the activations' dtype; a property of the "
                                "engine's code, never fitted")
    caps_scores_in_fused_attention: bool = Field(
        default=True, description="its fused attention kernel applies a model's attention-logit soft-cap (Gemma "
                                  "2); False: such a model's attention runs unfused, the cap's divide, tanh and "
                                  "multiply each a pass over the scores (mlx-lm's gemma2, since "
                                  "mx.fast.scaled_dot_product_attention takes no cap); a property of the engine's "
                                  "code, never fitted")
    dequantizes_kv_cache: bool = Field(
        default=False, description="a quantized KV cache is widened to a 16-bit copy of the span a pass attends "
                                   "to before attention reads it (ExLlamaV2's Q4/Q6/Q8 caches), instead of being "
                                   "read as it is stored; a property of the engine's code, never fitted")
    nonflash_scores_on_chip: bool = Field(
        default=False, description="without flash attention its attention still runs a kernel that keeps the "
                                   "scores on chip (PyTorch's memory-efficient SDPA or xformers over the expanded "
                                   "heads: ExLlamaV2), so no score matrix reaches memory; False: a matmul and a "
                                   "softmax that write the scores. A property of the engine's code, never fitted")
    unfused_elementwise: bool = Field(
        default=False, description="it runs each elementwise op (norm, residual add, activation, gate product) as a "
                                   "kernel of its own, one pass over the tensor each (eager PyTorch): those passes "
                                   "add to the linear layers' time; a property of the engine's code, never fitted")
    eager_host: bool = Field(
        default=False, description="it launches its ops one at a time from Python (eager PyTorch): its per-layer "
                                   "host time runs beside the device's work and its expert loop waits on it; a "
                                   "property of the engine, never fitted")
    reference_decoder: bool = Field(
        default=False, description="it is the decoder a calibration times at tiny shapes (calibrate/decoder.py): "
                                   "on a calibrated device the profile's measured host time per layer and per "
                                   "routed expert replaces per_layer_s and per_expert_s; a property, never fitted")
    memory_utilization: dict[int, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict, description="the share of a device's memory the engine lets itself use (weights, "
                                          "workspace and KV cache), by the fewest tensor-parallel ranks it applies "
                                          "from: vLLM's gpu_memory_utilization, SGLang's mem_fraction_static; "
                                          "empty: all of it. A property of the engine's defaults, never fitted")
    sampler_warmup_bytes_per_logit: float = Field(
        default=0.0, ge=0, description="device bytes per logit that the engine's memory profile holds when it warms "
                                       "its sampler up on one dummy request per sequence it may run (vLLM: the "
                                       "logits of max_num_seqs requests and the sampler's copies of them, 38.7 "
                                       "bytes a logit in its logs, docs/formulas.md §3): that peak, when above "
                                       "the prefill workspace's, is kept from the KV cache. A property of the "
                                       "engine, never fitted")
    prefill_chunk_tokens: int | None = Field(
        default=None, ge=1, description="the most prompt tokens one step runs by default, prompts split into "
                                        "chunks (vLLM V1's max_num_batched_tokens, SGLang's chunked_prefill_size): "
                                        "it bounds the prefill workspace; None: whole prompts. A property of the "
                                        "engine's defaults, never fitted")
    embedding_on_host: bool = Field(
        default=False, description="its input embedding table stays in host memory and only the looked-up rows "
                                   "reach the device (llama.cpp keeps the input layer on the CPU): an untied "
                                   "embedding takes no device memory; a property of the engine, never fitted")
    prefill_runs_alone: bool = Field(
        default=False, description="a step that prefills carries no decode tokens, and waiting prompts go before "
                                   "the running batch (SGLang's scheduler); False: decode tokens ride along in "
                                   "prefill steps (vLLM V1, TensorRT-LLM's in-flight batching, llama.cpp's "
                                   "server). It shapes an all-at-once run (docs/formulas.md §14); a property of "
                                   "the engine's scheduler, never fitted")
    graphed_prefill_tokens: int | None = Field(
        default=None, ge=0, description="the most tokens a step that prefills replays from captured CUDA graphs "
                                        "(vLLM V1: 512, its piecewise graphs; SGLang and vLLM's V0 engine: 0, "
                                        "graphs for decode steps only); a larger such step launches each kernel "
                                        "from Python, whose host time (eager_prefill_layer_s) runs beside the "
                                        "device's work. None: no prefill is launched so (a built TensorRT engine, "
                                        "a C++ runtime). A property of the engine's defaults, never fitted")
    eager_prefill_layer_s: dict[Literal["dense", "moe"], float] = Field(
        default_factory=dict, description="host seconds a prefill launched from Python spends on each dense and "
                                          "each MoE layer (graphed_prefill_tokens), measured with the engine's "
                                          "graphs off and on (docs/formulas.md §14); never fitted")
    allocates_kv_on_demand: bool = Field(
        default=False, description="its scheduler admits a request once its prompt's KV blocks are free and adds "
                                   "blocks as tokens come, preempting a running request when they run out (vLLM, "
                                   "SGLang): the cache holds the sequences' current lengths. False: a request "
                                   "reserves its final length on admission (TensorRT-LLM's GUARANTEED_NO_EVICT, "
                                   "llama.cpp's slots). A property of the engine's scheduler, never fitted")
    kv_free_fraction: float = Field(
        default=1.0, gt=0, le=1, description="the share of the memory left beside weights and workspace that the "
                                             "KV cache takes (TensorRT-LLM's free_gpu_memory_fraction); a property "
                                             "of the engine's defaults, never fitted")
    basis: str

    def expands_kv_heads(self, fused_attention):
        """Whether attention copies grouped KV heads out per query head, per configuration: always, or only
        where attention is not flash attention (``expands_grouped_kv``; docs/formulas.md §13)."""
        unfused = ~np.asarray(fused_attention, dtype=bool)
        return (self.expands_grouped_kv == "always") | ((self.expands_grouped_kv == "unfused") & unfused)

    def attention_fused(self, fused_attention, softcapped_scores):
        """Whether attention runs fused, per configuration: as asked, except for a model whose scores are soft-capped
        on an engine whose fused kernel cannot cap them (``caps_scores_in_fused_attention``)."""
        by_hand = np.asarray(softcapped_scores, dtype=bool) & (not self.caps_scores_in_fused_attention)
        return np.asarray(fused_attention, dtype=bool) & ~by_hand

    def broadcasts_kv_heads(self, fused_attention):
        """Whether attention reads each grouped KV head once per query head, per configuration: on an engine whose
        unfused matmuls broadcast the heads (``broadcasts_grouped_kv``)."""
        return self.broadcasts_grouped_kv & ~np.asarray(fused_attention, dtype=bool)

    def scores_on_chip(self, fused_attention):
        """Whether a pass's attention scores stay on chip, per configuration: with flash attention, or on an engine
        whose attention without it still runs a fused kernel (``nonflash_scores_on_chip``; docs/formulas.md §13)."""
        return np.asarray(fused_attention, dtype=bool) | self.nonflash_scores_on_chip

    def vector_decode(self, m, fused_attention, q):
        """Whether a decode pass of ``q`` new tokens a sequence runs the engine's vector attention kernel, per
        configuration of model columns ``m``: where the engine has one (``vector_decode_attention``) and the pass
        meets its conditions (MLX's ScaledDotProductAttention::use_fallback): fused attention, not MLA, a head
        size it is built for, q ≤ 8 and q·g ≤ 32 query rows per KV head."""
        q = np.asarray(q, dtype=float)
        return (self.vector_decode_attention & np.asarray(fused_attention, dtype=bool) & (m["is_mla"] == 0)
                & np.isin(m["head_dim"], VECTOR_ATTENTION_HEAD_DIMS) & (q <= VECTOR_ATTENTION_MAX_QUERY_TOKENS)
                & (q * m["query_heads_per_kv_head"] <= VECTOR_ATTENTION_MAX_QUERY_ROWS))

    def attended_kv_bits(self, kv_bits):
        """Bits per element of the cache attention reads: 16 where the engine widens a quantized cache to a
        16-bit copy first (``dequantizes_kv_cache``), else the cache's own."""
        widened = self.dequantizes_kv_cache & (np.asarray(kv_bits) < WIDE_KV_BITS)
        return np.where(widened, WIDE_KV_BITS, kv_bits)


# The 16-bit entries an engine that widens a quantized cache (ExLlamaV2's q_to_fp16_kv) attends to.
WIDE_KV_BITS = 16


HBM = DeviceDefaults(
    bandwidth_eff=0.90, compute_eff=0.85, usable_memory_fraction=1.0, runtime_reserve_bytes=1 * GiB,
    basis="copy kernels reach ~83-92% of HBM peak (gpt-fast: ~1700 of 2039 GB/s on A100; STREAM-like copies "
          "on H100 ~90%); large GEMMs reach 0.83-0.93 of dense peak (LLMCompass A100 curve, docs/formulas.md §7); "
          "~1 GiB CUDA context + cuBLAS workspace (gpu_poor assumes ~650 MB)")
GDDR = DeviceDefaults(
    bandwidth_eff=0.90, compute_eff=0.80, usable_memory_fraction=1.0, runtime_reserve_bytes=1 * GiB,
    basis="GDDR6/6X/7 copy bandwidth ~90% of peak; consumer boards clock down under sustained tensor load, "
          "hence a lower compute share than HBM parts")
UNIFIED = DeviceDefaults(
    bandwidth_eff=0.85, compute_eff=0.70, usable_memory_fraction=0.75, runtime_reserve_bytes=2 * GiB,
    basis="unified LPDDR SoCs (Linux iGPUs, Jetson, DGX Spark): GPU reaches ~85% of peak bandwidth; the GPU "
          "maps about three quarters of the memory (a Linux iGPU's GTT limit) and the OS itself lives in the "
          "same memory")
# Metal's recommendedMaxWorkingSetSize, the most memory the GPU may wire, is itself macOS's allowance for the GPU
# (llama.cpp's Metal logs: 10,922.67 MB on 16 GB and 21,845.34 MB on 32 GB, two thirds; 51,539.61 MB on 64 GB,
# three quarters; later macOS releases report 0.74-0.81): the OS's share is already outside it, so inside it only
# the runtime's own buffers are reserved, not the 2 GiB a Linux SoC keeps for its operating system.
APPLE_UNIFIED = UNIFIED.model_copy(update={
    "runtime_reserve_bytes": 0.5 * GiB,
    "basis": "Apple unified memory: the GPU reaches ~85% of peak bandwidth; Metal's working-set limit "
             "(recommendedMaxWorkingSetSize, 2/3 to 3/4 of RAM by macOS release and size) already leaves macOS its "
             "share, so only the runtime's own buffers (0.5 GiB) are reserved inside it"})
CPU = DeviceDefaults(
    bandwidth_eff=0.75, compute_eff=0.50, usable_memory_fraction=0.90, runtime_reserve_bytes=4 * GiB,
    basis="STREAM triad on DDR5 servers reaches ~75-80% of channel peak; AMX/AVX-512 GEMMs in inference "
          "engines reach about half of peak; the OS keeps some memory")

# The share of a link's one-way datasheet bandwidth a collective's bytes move at (nccl-tests bus bandwidth at
# large messages; the rest is protocol overhead; docs/formulas.md §8). NVLink: 366 GB/s all-reduce on 4 × H100
# SXM (450 GB/s one way), 230-250 GB/s on 8 × A100 SXM (300 GB/s). PCIe through its switches: 35-45 GB/s on
# 8 × H100 PCIe (64 GB/s one way). The scale-out network is taken at the scale-up figure.
SCALE_UP_COLLECTIVE_EFF = 0.8
PCIE_COLLECTIVE_EFF = 0.6


def collective_eff(hw: Hardware) -> float:
    """The collective bus bandwidth's share of the link tensor-parallel ranks use: a scale-up link's, else PCIe's."""
    return SCALE_UP_COLLECTIVE_EFF if hw.scale_up_link is not None else PCIE_COLLECTIVE_EFF


GENERIC_ENGINE = EngineDefaults(
    bandwidth_eff={"native": 0.80, "weight_only": 0.60, "gguf": 0.75, "fp4": 0.70},
    kv_bandwidth_eff=0.70,
    compute_eff=0.70,
    per_step_s=100e-6,
    per_layer_s=10e-6,
    allreduce_latency_s=20e-6,
    basis="native 16/8-bit GEMV kernels: gpt-fast bf16 decode at 68.5% of A100 peak = 0.82 of its measured "
          "practical peak; weight-only int8/int4 dequant kernels 52%/42% of peak (0.76/0.61 of bf16), "
          "docs/formulas.md §9; BLIS trained-physics on vLLM: KV-read term 1.9x (~53%) vs weights 1.4x (~71%); "
          "prefill MFU 0.45 (H100) to 0.32 (L40S) in BLIS, ~0.6 overall here (0.85 device x 0.70 engine); "
          "per-step 100 us and per-layer 10 us are the order of BLIS's fitted 126 us/step and 32 us/layer "
          "with CUDA graphs reducing launch costs; one decode-sized all-reduce costs ~20 us (LLMCompass measured "
          "26 us on 4xA100 NVLink, AIConfigurator assumes 10 us p2p latency on H100/H200)")

# The roofline at 100% of the datasheet, with no fixed costs: what no engine can beat. Prediction
# intervals are capped by it, and fitted efficiencies are bounded below it (docs/formulas.md §9).
PHYSICAL_LIMIT = EngineDefaults(
    bandwidth_eff={"native": 1.0, "weight_only": 1.0, "gguf": 1.0, "fp4": 1.0}, kv_bandwidth_eff=1.0,
    compute_eff=1.0, per_step_s=0.0, per_layer_s=0.0, allreduce_latency_s=0.0, fp16_accumulate=True,
    basis="physical limit: datasheet bandwidth and dense peak, no overheads")

GROUP_OF_CLASS = {c: g for g, classes in DEVICE_GROUPS.items() for c in classes}


def memory_utilization(engine: EngineDefaults, tp) -> np.ndarray:
    """The share of each device's memory the engine uses at ``tp`` tensor-parallel ranks (1 where it sets none)."""
    share = np.ones_like(np.asarray(tp, dtype=float))
    for ranks, value in sorted(engine.memory_utilization.items()):
        share = np.where(np.asarray(tp) >= ranks, value, share)
    return share


def memory_budget(engine: EngineDefaults, tp, ubatch_tokens=np.inf) -> dict:
    """The engine's memory budget as memory_fit takes it: ``engine_share``, ``kv_free_fraction`` and
    ``chunk_tokens``, the most prompt tokens one pass holds: its chunk, or for an engine that runs prompts in
    micro-batches the micro-batch of ``ubatch_tokens`` (llama.cpp sizes its compute buffer for one n_ubatch;
    docs/formulas.md §3)."""
    chunk = np.inf if engine.prefill_chunk_tokens is None else float(engine.prefill_chunk_tokens)
    if engine.prefill_in_ubatches:
        chunk = np.minimum(chunk, np.asarray(ubatch_tokens, dtype=float))
    return {"engine_share": memory_utilization(engine, tp), "kv_free_fraction": engine.kv_free_fraction,
            "chunk_tokens": chunk}


def compute_ceiling(hw: Hardware) -> float:
    """The most of the listed dense 16-bit peak any kernel can reach on this device.

    GeForce cards list their FP16/BF16 tensor rate with FP32 accumulation; with FP16 accumulation (as
    llama.cpp's cuBLAS path uses) they run twice as fast (NVIDIA Ampere GA102, Ada and Blackwell GeForce
    whitepapers: "FP16 Tensor TFLOPS with FP16 Accumulate" = 2 x "with FP32 Accumulate"). Workstation
    and datacenter parts run both at one rate.
    """
    return 2.0 if hw.vendor == "NVIDIA" and hw.device_class is DeviceClass.consumer_gpu else 1.0


def compute_eff_by_class(engine: EngineDefaults) -> np.ndarray:
    """The engine's compute efficiency for each device class, in :data:`CLASS_ORDER`."""
    return np.array([engine.compute_eff_by_group.get(GROUP_OF_CLASS[c], engine.compute_eff) for c in CLASS_ORDER])


def bandwidth_scale_of_groups(engine: EngineDefaults, dequantizing: bool = False) -> np.ndarray:
    """The engine's bandwidth factor on each device group, in :data:`GROUP_ORDER` (native or dequantizing kernels);
    a device takes its :func:`bandwidth_group`'s."""
    native = [engine.bandwidth_scale_by_group.get(g, 1.0) for g in GROUP_ORDER]
    if not dequantizing:
        return np.array(native)
    return np.array([engine.dequant_scale_by_group.get(g, n) for g, n in zip(GROUP_ORDER, native)])


_HBM_TYPES = {MemoryType.HBM2, MemoryType.HBM2e, MemoryType.HBM3, MemoryType.HBM3e}
_GDDR_TYPES = {MemoryType.GDDR5, MemoryType.GDDR5X, MemoryType.GDDR6, MemoryType.GDDR6X, MemoryType.GDDR7}
# The device group a discrete device's memory puts its weight stream in (bandwidth_group).
GROUP_OF_MEMORY = {**dict.fromkeys(_HBM_TYPES, "datacenter"), **dict.fromkeys(_GDDR_TYPES, "desktop")}


def bandwidth_group(hw: Hardware) -> str:
    """The device group whose bandwidth factors a device's weight stream takes: the memory its kernels read, not
    the market it is sold in. An SoC or CPU stays "unified"; a discrete device with HBM is "datacenter", with GDDR
    "desktop" (GROUP_OF_MEMORY); other memory goes by its class.

    An L40S or A40 (GDDR6, sold for the datacenter) streams llama.cpp's weights as the RTX 6000 Ada and A6000 on
    the same dies do: predicted with the HBM parts' factors, their held-out decode ran 22-26% faster than
    estimated (docs/formulas.md §9, "Bandwidth groups by memory").
    """
    market = GROUP_OF_CLASS[hw.device_class.value]
    return market if market == "unified" else GROUP_OF_MEMORY.get(hw.memory.type, market)


@lru_cache(maxsize=1)
def matmul_ceilings() -> dict[str, float]:
    """Measured best-GEMM fractions of the dense peak by device name (matmul_ceilings.yaml, with its source)."""
    doc = load_yaml(resources.files("estimator.efficiency").joinpath("matmul_ceilings.yaml").read_text())
    return {name: float(entry[0]) for name, entry in doc["devices"].items()}


def device_defaults(hw: Hardware) -> DeviceDefaults:
    """Pick the default device efficiencies by device class and memory type; a device whose best GEMM was
    measured (matmul_ceilings.yaml) takes that fraction as its compute efficiency."""
    defaults = _class_defaults(hw)
    measured = matmul_ceilings().get(hw.name)
    if measured is None:
        return defaults
    return defaults.model_copy(update={"compute_eff": measured,
                                       "basis": f"{defaults.basis}; compute: measured best BF16 GEMM {measured:.3f} "
                                                "of the dense peak (matmul_ceilings.yaml)"})


def _class_defaults(hw: Hardware) -> DeviceDefaults:
    if hw.device_class is DeviceClass.cpu:
        return CPU
    if hw.device_class is DeviceClass.soc_unified:
        return APPLE_UNIFIED if hw.vendor == "Apple" else UNIFIED
    if hw.memory.type in _HBM_TYPES:
        return HBM
    if hw.memory.type in _GDDR_TYPES:
        return GDDR
    return UNIFIED if hw.memory.type.value.startswith("LPDDR") else CPU
