"""Specs to arrays: one column per field, one entry per model / device / format.

This is the edge between the pydantic specs and the numpy core. Each
``*_columns`` function returns a :class:`Columns` whose arrays have one entry
per spec; :func:`estimator.evaluation.api.sweep` reshapes them onto orthogonal axes so the
core broadcasts, and :func:`estimator.evaluation.api.evaluate_rows` gathers them by index
for a list of arbitrary configurations.
"""

from __future__ import annotations

from itertools import product
from typing import Sequence

import numpy as np

from estimator.efficiency.calibration_profile import (
    WEIGHT_STREAM_ROWS,
    CalibrationProfile,
    device_efficiencies,
    weight_stream_efficiencies,
)
from estimator.efficiency.defaults import (
    CLASS_ORDER,
    GENERIC_ENGINE,
    GROUP_ORDER,
    EngineDefaults,
    bandwidth_group,
    collective_eff,
    compute_ceiling,
    device_defaults,
)
from estimator.errors import ConfigurationError
from estimator.physics.flops import STATE_FLOPS_PER_ELEMENT
from estimator.physics.params import count_params, mlp_matrices
from estimator.physics.traffic import unfused_elementwise_bytes_per_token
from estimator.specs.formats import KVFormat, WeightFormat
from estimator.specs.hardware import Hardware
from estimator.specs.model import ModelSpec

# Columns of a calibrated device's decode curve (weight-stream efficiency at each measured row count).
WEIGHT_STREAM_KEYS = tuple(f"weight_stream_eff_m{m}" for m in WEIGHT_STREAM_ROWS)
# The compute efficiency a profile lends to every dtype: its widest measured GEMM, since a profile
# need not cover every format's dtype.
CALIBRATED_DTYPES = ("bf16", "fp16", "fp32")

Columns = dict[str, np.ndarray]

# Prefill and decode attention run in 16-bit on every engine we model.
ATTENTION_DTYPES = ("bf16", "fp16", "fp32")


def model_columns(models: Sequence[ModelSpec]) -> Columns:
    """Per-model parameter groups and per-token attention sizes, in elements."""
    rows = [_model_row(m) for m in models]
    return {key: np.array([r[key] for r in rows], dtype=float) for key in rows[0]}


def _model_row(model: ModelSpec) -> dict[str, float]:
    s, p = model.shape, count_params(model)
    num_local = s.num_local_layers
    if s.mla is None:
        kv_per_layer = 2 * s.num_kv_heads * s.head_dim               # K and V per token
        prefill_attn_flops = 4 * s.num_attention_heads * s.head_dim  # QK^T and AV, per (query, key) pair
        decode_attn_flops = prefill_attn_flops
    else:
        m = s.mla
        kv_per_layer = m.kv_lora_rank + m.qk_rope_head_dim           # one latent + RoPE key, no factor 2
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        prefill_attn_flops = 2 * s.num_attention_heads * (qk + m.v_head_dim)
        # absorbed weights in decode: every head scores and mixes the (d_c + d_r)-wide latent
        decode_attn_flops = 2 * s.num_attention_heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
    n_mat = mlp_matrices(s)
    moe = s.moe
    ffn_width = s.intermediate_size if moe is None else moe.experts_per_token * moe.expert_intermediate_size
    attention_io = (s.hidden_size + (s.num_attention_heads * (1 + s.attention_output_gate) + 2 * s.num_kv_heads)
                    * s.head_dim + s.num_attention_heads * s.head_dim + s.hidden_size)   # QKV proj in/out, O in/out
    return {
        "hidden": s.hidden_size,
        "layers": s.num_layers,
        "local_layers": num_local,
        "window": s.sliding_window or 0,
        "heads": s.num_attention_heads,
        "kv_heads": s.num_kv_heads,
        "query_heads_per_kv_head": s.num_attention_heads // s.num_kv_heads,   # g of grouped-query attention
        "head_dim": s.head_dim,
        "is_mla": float(s.mla is not None),
        "softcapped_scores": float(s.attention_logit_softcap is not None),
        "vocab": s.vocab_size,
        "max_context": s.max_context,
        # weights always streamed: attention, dense MLPs, shared experts, routers (and docs/formulas.md §15 roles)
        "params_dense_linear": p.dense_linear,
        "params_routed_one": p.routed_expert_one,      # one expert of one MoE layer
        # token mixers (attention, indexers, linear attention): whole on every rank under attention data parallelism
        "params_attention": p.attention + p.indexer + p.linear_attention,
        "moe_layers": p.num_moe_layers,
        "experts": p.num_experts,
        "experts_per_token": p.experts_per_token,
        "params_head": s.vocab_size * s.hidden_size,   # streamed even when tied to the embedding
        "head_tied": float(s.tie_word_embeddings),
        "params_embedding": p.embedding,
        "params_norms": p.norms,
        "params_total": p.total,
        "params_active": p.active,
        "kv_elems_per_token_layer": kv_per_layer,
        "attn_flops_prefill_per_pair_layer": prefill_attn_flops,
        "attn_flops_decode_per_pair_layer": decode_attn_flops,
        "q_elems_per_token_layer": s.num_attention_heads * s.head_dim,
        # matmul inputs and outputs each token reads and writes per layer (activation traffic)
        "act_elems_per_token_layer": (
            _mixer_io(s, attention_io)
            + s.hidden_size + (n_mat - 1) * ffn_width                                   # up/gate in/out
            + ffn_width + s.hidden_size                                                 # down in/out
            + 4 * s.hidden_size                                                         # norms, residual adds
            + _gemma3n_io(s)),
        "ffn_width": ffn_width * (n_mat - 1),
        "unfused_elementwise_bytes_per_token": unfused_elementwise_bytes_per_token(s, p.num_moe_layers),
        **mechanism_columns(s, p),
    }


def _mixer_io(s, attention_io: int) -> int | float:
    """Token mixer in/out elements per layer: attention's, or the mean with Gated DeltaNet layers'.

    See docs/formulas.md §15.1.
    """
    la = s.linear_attention
    if la is None:
        return attention_io
    key_dim, value_dim = la.num_key_heads * la.key_head_dim, la.num_value_heads * la.value_head_dim
    linear_io = s.hidden_size + 2 * key_dim + 2 * value_dim + 2 * la.num_value_heads + value_dim + s.hidden_size
    return (s.num_attention_layers * attention_io + s.num_linear_layers * linear_io) / s.num_layers


def _gemma3n_io(s) -> int:
    """AltUp's n-wide residual (predict and correct read and write it), per-layer-input and LAuReL in/out.

    See docs/formulas.md §15.3.
    """
    d, ple = s.hidden_size, s.per_layer_embeddings
    altup = 4 * s.altup_num_inputs * d if s.altup_num_inputs > 1 else 0
    per_layer = 0 if ple is None else 2 * (d + ple.hidden_size_per_layer_input)
    return altup + per_layer + (2 * (d + s.laurel_rank) if s.laurel_rank else 0)


# Lightning-indexer keys are FP8 with a float32 scale per 128 values (DeepSeek-V3.2-Exp inference/model.py,
# k_cache and k_scale_cache; vLLM's indexer cache holds the same 132 bytes for d_i = 128): docs/formulas.md §15.2.
INDEX_KEY_BITS, INDEX_SCALE_BLOCK, INDEX_SCALE_BYTES = 8, 128, 4


def mechanism_columns(s, p) -> dict[str, float]:
    """Columns of Gated DeltaNet state, sparse attention, KV sharing and per-layer embeddings (docs/formulas.md §15).

    Every one is 0 for a plain transformer, and ``attn_layers`` / ``kv_layers`` equal ``layers``, so the
    formulas reduce to the plain ones bit for bit.
    """
    la, sa, ple = s.linear_attention, s.sparse_attention, s.per_layer_embeddings
    recurrent = 0 if la is None else la.num_value_heads * la.key_head_dim * la.value_head_dim
    conv = 0 if la is None else la.conv_channels * (la.conv_kernel_dim - 1)    # vLLM keeps K - 1 columns
    return {
        "attn_layers": s.num_attention_layers,                       # softmax attention: reads, FLOPs
        "kv_layers": s.num_attention_layers - s.num_kv_shared_layers,  # hold their own cache: capacity, writes
        "kv_local_layers": s.num_local_layers - s.num_kv_shared_local_layers,
        "params_unused": p.unused,                                   # stored, never multiplied
        "params_per_layer_embedding": p.per_layer_embedding,         # held in host memory
        "ple_elems_per_token": 0 if ple is None else s.num_layers * ple.hidden_size_per_layer_input,
        # Gated DeltaNet: state elements per sequence over all linear layers, and its update FLOPs per token
        "state_elems_per_sequence": s.num_linear_layers * (recurrent + conv),
        "recurrent_elems_per_sequence": s.num_linear_layers * recurrent,
        "state_flops_per_token": s.num_linear_layers * STATE_FLOPS_PER_ELEMENT * recurrent,
        "state_heads": 1 if la is None else la.num_key_heads,
        # DeepSeek Sparse Attention: top-k cap (0 = none), indexer key bytes and FLOPs per (query, key) pair
        "attn_topk": 0 if sa is None else sa.index_topk,
        "index_key_bytes_per_token_layer": 0 if sa is None else (
            sa.index_head_dim * INDEX_KEY_BITS / 8 + -(-sa.index_head_dim // INDEX_SCALE_BLOCK) * INDEX_SCALE_BYTES),
        "index_flops_per_pair_layer": 0 if sa is None else 2 * sa.index_n_heads * (sa.index_head_dim + 1),
    }


def hardware_columns(devices: Sequence[Hardware], physical_limit: bool = False) -> Columns:
    """Per-device peaks in base units and the default device efficiencies (1 for ``physical_limit``: the
    datasheet itself)."""
    defaults = [device_defaults(hw) for hw in devices]
    return {
        "bandwidth_bytes_per_s": np.array([hw.memory_bandwidth_bytes_per_s for hw in devices]),
        # NaN where the database records none (every non-NVIDIA device): no per-SM bound applies there
        "streaming_multiprocessors": np.array([np.nan if hw.streaming_multiprocessors is None
                                               else hw.streaming_multiprocessors.value for hw in devices]),
        "capacity_bytes": np.array([hw.memory_capacity_bytes for hw in devices]),
        "attention_flops_per_s": np.array([_first_peak(hw, ATTENTION_DTYPES)[1] for hw in devices]),
        # the vector (non-tensor) FP32 rate, NaN where not listed: what bounds a generic copy kernel's indexing
        "fp32_flops_per_s": np.array([hw.peak_flops_per_s("fp32") or np.nan for hw in devices]),
        "link_bytes_per_s": np.array([link_bandwidth(hw) for hw in devices]),
        "host_link_bytes_per_s": np.array([FALLBACK_LINK_BYTES_PER_S if hw.host_link is None
                                           else hw.host_link.bandwidth.base for hw in devices]),
        "device_class_code": np.array([CLASS_ORDER.index(hw.device_class.value) for hw in devices]),
        "bandwidth_group_code": np.array([GROUP_ORDER.index(bandwidth_group(hw)) for hw in devices]),
        "device_bandwidth_eff": np.array([1.0 if physical_limit else d.bandwidth_eff for d in defaults]),
        "device_compute_eff": np.array([1.0 if physical_limit else d.compute_eff for d in defaults]),
        "collective_eff": np.array([1.0 if physical_limit else collective_eff(hw) for hw in devices]),
        "fp16_accumulate_speedup": np.array([compute_ceiling(hw) for hw in devices]),
        "usable_memory_fraction": np.array([d.usable_memory_fraction for d in defaults]),
        "runtime_reserve_bytes": np.array([d.runtime_reserve_bytes for d in defaults]),
        # 1 where a calibration measured the device's GEMM rate (device_compute_eff is then that rate)
        "calibrated_gemm": np.zeros(len(devices)),
        # a calibration's measured host time of an eager step (estimator/physics/host_time.py); NaN: none
        "eager_layer_s": np.full(len(devices), np.nan),
        "eager_expert_s": np.full(len(devices), np.nan),
        # a calibration's measured rate of grouped KV heads copied out per query head (repeat_kv); NaN: none
        "kv_expand_bytes_per_s": np.full(len(devices), np.nan),
    }


def format_columns(formats: Sequence[WeightFormat], engine: EngineDefaults = GENERIC_ENGINE) -> Columns:
    return {
        "expert_bits": np.array([f.expert_bits for f in formats]),
        "dense_bits": np.array([f.dense_bits for f in formats]),
        "head_bits": np.array([f.head_bits for f in formats]),
        "embedding_bits": np.array([f.embedding_bits for f in formats]),
        "engine_bandwidth_eff": np.array([engine.bandwidth_eff[f.dequant] for f in formats]),
        "dequantizes": np.array([f.dequant != "native" for f in formats]),
    }


def kv_columns(kv_formats: Sequence[KVFormat]) -> Columns:
    return {"kv_bits": np.array([f.bits for f in kv_formats])}


# Devices that publish no host or scale-up link are assumed to talk over PCIe 4.0 x16 (32 GB/s each way).
FALLBACK_LINK_BYTES_PER_S = 32e9


def link_bandwidth(hw: Hardware) -> float:
    """Per-direction bandwidth tensor-parallel ranks exchange activations over: NVLink/IF, else the host link."""
    link = hw.scale_up_link or hw.host_link
    return FALLBACK_LINK_BYTES_PER_S if link is None else link.bandwidth.base


def _first_peak(hw: Hardware, dtypes: Sequence[str]) -> tuple[str, float]:
    for dtype in dtypes:
        peak = hw.peak_flops_per_s(dtype)
        if peak is not None:
            return dtype, peak
    published = ", ".join(hw.dense_peak) or "none"
    raise ConfigurationError(
        f"{hw.name} publishes no peak for {'/'.join(dtypes)} (it has: {published}); choose a weight format "
        f"that computes in one of those, or add the missing peak to its YAML entry")


def compute_peak_table(formats: Sequence[WeightFormat],
                       devices: Sequence[Hardware]) -> tuple[np.ndarray, list[list[str]]]:
    """Dense peak FLOP/s of each format's compute dtype on each device, shape (formats, devices)."""
    dtypes = [[_first_peak(hw, f.compute_dtypes)[0] for hw in devices] for f in formats]
    peaks = np.array([[_first_peak(hw, f.compute_dtypes)[1] for hw in devices] for f in formats])
    return peaks, dtypes


def fp4_gemm_table(dtypes: list[list[str]]) -> np.ndarray:
    """1 where a format's GEMMs run at the device's FP4 tensor rate, from compute_peak_table's dtypes."""
    return np.array([[float(d == "fp4") for d in row] for row in dtypes])


def apply_calibration(hw_columns: Columns, i, profile: CalibrationProfile, device: Hardware) -> None:
    """Entry ``i`` of :func:`hardware_columns` takes a calibration's measurements in place: the device's read
    bandwidth and GEMM rate as its efficiencies, and the measured eager host times and grouped-KV copy rate."""
    bandwidth_eff, compute_eff = device_efficiencies(profile, device, CALIBRATED_DTYPES)
    hw_columns["device_bandwidth_eff"][i] = bandwidth_eff
    if compute_eff is not None:
        hw_columns["device_compute_eff"][i] = compute_eff
        hw_columns["calibrated_gemm"][i] = 1.0
    for key in ("eager_layer_s", "eager_expert_s", "kv_expand_bytes_per_s"):
        hw_columns[key][i] = getattr(profile.summary, key) or np.nan


def weight_stream_columns(models, devices, fmts, calibrations: dict, physical_limit: bool) -> dict[str, np.ndarray]:
    """Per model, device and format, a calibrated device's decode curve (weight-stream efficiency at each row
    count of WEIGHT_STREAM_ROWS; the model's own where the profile timed its matrices), NaN elsewhere; empty
    when no device has one (the estimate then reads no curve)."""
    curves = np.full((len(WEIGHT_STREAM_ROWS), len(models), len(devices), len(fmts)), np.nan)
    for i, device in enumerate(devices):
        profile = None if physical_limit else calibrations.get(device.name)
        if profile is None:   # the usual case: no per-model, per-format work for an uncalibrated device
            continue
        for (j, fmt), (k, model) in product(enumerate(fmts), enumerate(models)):
            found = weight_stream_efficiencies(profile, device, fmt.name, model.name)
            if found:
                curves[:, k, i, j] = found
    if np.isnan(curves).all():
        return {}
    return dict(zip(WEIGHT_STREAM_KEYS, curves))
