"""Mechanisms beyond the plain transformer (docs/formulas.md §15): Gated DeltaNet state (Qwen3-Next), DeepSeek
Sparse Attention (DeepSeek-V3.2), per-layer embeddings, KV-cache sharing, AltUp and LAuReL (Gemma 3n).

Expected numbers are worked by hand from the config.json shapes quoted in the models_db entries. Mechanisms still
outside the shapes (Mamba-style recurrent layers, per-layer FFN widths) are refused by name
(ModelSpec.require_modelled), from a YAML entry, a config.json or a GGUF file alike.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
from gguf.constants import GGMLQuantizationType as Q

import estimator
from estimator.errors import ConfigurationError
from estimator.evaluation.columns import format_columns, model_columns
from estimator.physics import flops as fl
from estimator.physics import traffic as tr
from estimator.physics.memory import kv_cache_bytes_per_sequence
from estimator.physics.params import (
    attention_params_per_layer,
    count_params,
    indexer_params_per_layer,
    linear_attention_params_per_layer,
)
from estimator.specs.config_json import load_config_json, spec_from_config, unmodelled_mechanisms
from estimator.specs.formats import weight_format
from estimator.specs.gguf_file import read_gguf
from estimator.specs.model import MECHANISMS, ModelSpec
from tests.helpers import cli
from tests.test_gguf_safetensors import _common, _finish, _quantized

MODELLED = ["Qwen3-Next-80B-A3B", "DeepSeek-V3.2-Exp", "Gemma-3n-E4B", "Gemma-3n-E2B"]
NEW_ENTRIES = [*MODELLED, "Mistral-Small-3-24B"]
BF16 = 2


def _columns(db, name):
    return model_columns([db.models.get(name)])


def _value(x) -> float:
    return float(np.asarray(x).ravel()[0])


# --- the entries ---------------------------------------------------------------------------------------------

def test_the_database_holds_at_least_80_models(db):
    assert len(db.models) >= 80


@pytest.mark.parametrize("name", NEW_ENTRIES)
def test_new_entry_loads_with_a_published_count(db, name):
    spec = db.models.get(name)
    assert spec.published_params is not None and spec.published_params.source.startswith("http")
    assert spec.config_source.startswith("https://huggingface.co/")
    assert count_params(spec).total > 0


@pytest.mark.parametrize("name", MODELLED)
def test_entry_is_modelled_and_its_count_checked(db, name):
    spec = db.models.get(name)
    assert spec.unmodelled_mechanisms == [] and spec.published_params_checked
    assert spec.require_modelled() is spec
    pub, counts = spec.published_params, count_params(spec)
    total = counts.total_as_published(pub.total_includes_embeddings)
    assert total / 1e9 == pytest.approx(pub.total_billion, rel=0.02)


@pytest.mark.parametrize("name, gpu, n_gpus, fmt", [
    ("Qwen3-Next-80B-A3B", "h100", 4, "bf16"), ("DeepSeek-V3.2-Exp", "h200", 8, "fp8"),
    ("Gemma-3n-E4B", "h100", 1, "bf16"), ("Gemma-3n-E2B", "rtx 4090", 1, "bf16")])
def test_estimate_runs_and_decode_never_speeds_up_with_context(db, name, gpu, n_gpus, fmt):
    speeds = [estimator.estimate(name, gpu, n_gpus=n_gpus, weight_format=fmt, prompt_tokens=p, output_tokens=64,
                                 calibration="none", db=db) for p in (512, 4096, 30000)]
    assert all(e.fits for e in speeds)
    itl = [e.itl_s for e in speeds]
    assert all(np.isfinite(itl)) and itl == sorted(itl)


def test_sweep_takes_them_with_other_models(db):
    table = estimator.sweep(["llama-3.1-8b", "gemma-3n-e2b", "gemma-3n-e4b"], ["h100"], db=db)
    assert len(table) == 3 and np.all(np.isfinite(table.columns["itl_s"]))


def test_cli_estimates_deepseek_v32(capsys):
    code, out, err = cli(capsys, "estimate", "--model", "deepseek-v3.2-exp", "--gpu", "h200", "--gpus", "8",
                         "--format", "fp8", "--calibration", "none", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["fits"] and result["kv_cache_bytes_per_token"] == 61 * (576 * 2 + 132)


def test_list_show_and_check(capsys):
    code, out, _ = cli(capsys, "list", "models")
    assert code == 0 and all(name in out for name in NEW_ENTRIES)
    assert "+GDN (36/48)" in out and "+DSA top-2048" in out and "+KV shared (15/35)" in out
    code, out, _ = cli(capsys, "show", "model", "gemma-3n-e4b")
    assert code == 0 and "per_layer_embeddings" in out and "params total (computed)" in out
    code, out, _ = cli(capsys, "check")
    assert code == 0 and "model entries: all valid" in out
    assert "mechanisms the schema does not model" not in out and "(unchecked)" not in out


def test_an_ordinary_model_passes_through(db):
    spec = db.models.get("Mistral-Small-3-24B")
    assert spec.unmodelled_mechanisms == [] and spec.published_params_checked
    assert spec.require_modelled() is spec and spec.unmodelled_message() is None
    assert spec.shape.max_context == 32768
    assert estimator.estimate("mistral-small-3", "h100", db=db).fits


def test_mistral_small_3_differs_from_3_1_only_in_context(db):
    old, new = db.models.get("mistral-small-3.1"), db.models.get("mistral-small-24b-2501")
    assert new.shape.model_copy(update={"max_context": old.shape.max_context}) == old.shape


def test_the_mechanisms_left_have_words_and_a_repeat_is_refused(db):
    assert set(MECHANISMS) == {"linear_attention_state", "per_layer_ffn_widths"}
    data = db.models.get("qwen3-next").model_dump()
    with pytest.raises(ValueError, match="more than once"):
        ModelSpec(**{**data, "unmodelled_mechanisms": ["per_layer_ffn_widths", "per_layer_ffn_widths"]})
    with pytest.raises(ValueError):
        ModelSpec(**{**data, "unmodelled_mechanisms": ["sparse_attention"]})   # modelled now: not a mechanism left
    spec = ModelSpec(**{**data, "name": "Hybrid", "unmodelled_mechanisms": ["linear_attention_state"]})
    with pytest.raises(ConfigurationError, match="Hybrid uses state-space or recurrent layers other than Gated "
                                                 "DeltaNet .* does not model yet"):
        estimator.estimate(spec, "h100", db=db)


# --- Qwen3-Next: Gated DeltaNet state ------------------------------------------------------------------------

def test_qwen3_next_weights_by_hand(db):
    s = db.models.get("qwen3-next").shape
    assert (s.num_linear_layers, s.num_attention_layers) == (36, 12)
    # in_proj_qkvz, in_proj_ba, conv1d (8192 channels x 4), A_log + dt_bias, gated norm, out_proj
    assert linear_attention_params_per_layer(s) == (2048 * (2 * 2048 + 2 * 4096) + 2048 * 64 + 8192 * 4 + 64 + 128
                                                    + 4096 * 2048) == 33_718_464
    # q with its output gate (2 x 16 x 256), k and v (2 x 256 each), o
    assert attention_params_per_layer(s) == 2048 * 8192 + 2 * 2048 * 512 + 4096 * 2048 == 27_262_976
    assert count_params(db.models.get("qwen3-next")).total == 79_674_286_848


def test_qwen3_next_kv_cache_and_state_by_hand(db):
    m = _columns(db, "qwen3-next")
    # 12 full-attention layers x 2 KV heads x 256 x (K, V) x 2 bytes
    assert _value(tr.kv_bytes_per_token(m, 16)) == 12 * 2 * 256 * 2 * BF16 == 24_576
    # 36 layers x (32 x 128 x 128 recurrent + 8192 x (4 - 1) conv) elements, bf16
    state = 36 * (32 * 128 * 128 + 8192 * 3)
    assert state == 19_759_104
    assert _value(tr.state_bytes_per_sequence(m, 1)) == state * BF16 == 39_518_208
    assert _value(tr.state_bytes_per_sequence(m, 4)) == state * BF16          # 16 key heads split over 4 ranks
    assert _value(kv_cache_bytes_per_sequence(m, 16, 8192, 1)) == 24_576 * 8192
    e = estimator.estimate("qwen3-next", "h100", n_gpus=4, prompt_tokens=2048, output_tokens=256, calibration="none",
                           db=db)
    copies = 4 * max(1 / 4, 1 / 2)        # 2 KV heads over tp = 4: each held twice
    assert e.memory_kv_cache_bytes * 4 == pytest.approx(24_576 * copies * 2304 + state * BF16, rel=1e-12)


def test_qwen3_next_decode_step_by_hand(db):
    m, f = _columns(db, "qwen3-next"), format_columns([weight_format("bf16")])
    S, state = 10_000.0, 19_759_104 * BF16
    ledger = tr.decode_bytes(m, f, 16, 1, S, S, 1, True)
    assert _value(ledger["kv_read"]) == pytest.approx(24_576 * S + state, rel=1e-12)   # state read once
    assert _value(ledger["kv_write"]) == pytest.approx(24_576 + state, rel=1e-12)      # and written back
    flops = fl.decode_flops(m, 1, S, S)
    # softmax attention in 12 layers over S; the state update 7 x 32 x 128 x 128 in 36, whatever S
    assert _value(flops["attention"]) == pytest.approx(4 * 16 * 256 * 12 * S + 36 * 7 * 32 * 128 * 128, rel=1e-12)


def _dense_twin(db):
    """Qwen3-Next with all 48 layers full attention: the same shapes without the Gated DeltaNet layers."""
    spec = db.models.get("qwen3-next")
    return spec.model_copy(update={"name": "dense-twin", "shape": spec.shape.model_copy(update={
        "linear_attention": None})})


def test_qwen3_next_decode_grows_far_slower_with_context_than_dense_attention(db):
    def growth(model):
        itl = [estimator.estimate(model, "h200", n_gpus=4, weight_format="fp8", batch=4, prompt_tokens=p,
                                  output_tokens=2, calibration="none", db=db).itl_s for p in (1024, 131072)]
        return itl[1] / itl[0]
    hybrid, dense = growth("qwen3-next"), growth(_dense_twin(db))
    # the time added by 128K of context: a quarter of the layers hold a cache, so under a third of the twin's
    assert hybrid > 1 and dense - 1 > 3.5 * (hybrid - 1)
    short = estimator.estimate("qwen3-next", "h200", n_gpus=4, weight_format="fp8", batch=4, prompt_tokens=1024,
                               output_tokens=2, calibration="none", db=db)
    assert short.kv_cache_bytes_per_token * 4 == tr.kv_bytes_per_token(model_columns([_dense_twin(db)]), 16)[0]


# --- DeepSeek-V3.2: sparse attention -------------------------------------------------------------------------

def test_deepseek_v32_indexer_by_hand(db):
    s = db.models.get("deepseek-v3.2-exp").shape
    # wq_b from the 1536-wide query latent to 64 x 128, wk 7168 -> 128, k_norm weight and bias, weights_proj -> 64
    assert indexer_params_per_layer(s) == 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64 == 13_959_424
    v3, v32 = count_params(db.models.get("deepseek-v3")), count_params(db.models.get("deepseek-v3.2-exp"))
    assert v32.total - v3.total == v32.active - v3.active == 61 * 13_959_424
    m = _columns(db, "deepseek-v3.2-exp")
    # per token and layer: the 576-element latent in bf16 and a 128-byte FP8 key with its float32 scale
    assert _value(tr.kv_bytes_per_token_layer(m, 16)) == 576 * 2 + 128 + 4
    assert _value(tr.kv_bytes_per_token(m, 8)) == 61 * (576 + 132)       # the indexer key stays FP8


def test_deepseek_v32_decode_bytes_at_1k_and_64k(db):
    m, f = _columns(db, "deepseek-v3.2-exp"), format_columns([weight_format("fp8")])

    def kv_read(S):
        return _value(tr.decode_bytes(m, f, 16, 1, S, S, 1, True, span_topk=min(S, 2048))["kv_read"])
    assert kv_read(1024) == pytest.approx(61 * (1152 + 132) * 1024, rel=1e-12)
    # past the top-2048 cap the latent reads stop; only the 132-byte indexer keys keep growing
    assert kv_read(65536) == pytest.approx(61 * (1152 * 2048 + 132 * 65536), rel=1e-12)
    assert kv_read(65536) / kv_read(1024) < 10          # 64 times the context, under 10 times the reads
    plain = _columns(db, "deepseek-v3")
    dense_ratio = (_value(tr.decode_bytes(plain, f, 16, 1, 65536.0, 65536.0, 1, True)["kv_read"])
                   / _value(tr.decode_bytes(plain, f, 16, 1, 1024.0, 1024.0, 1, True)["kv_read"]))
    assert dense_ratio == pytest.approx(64)
    flops = fl.decode_flops(m, 1, 65536.0, 65536.0, 2048.0)
    absorbed = 2 * 128 * (2 * 512 + 64)           # MLA per (query, key) pair with absorbed weights
    assert _value(flops["attention"]) == pytest.approx(61 * (absorbed * 2048 + 2 * 64 * 129 * 65536), rel=1e-12)


def test_deepseek_v32_long_context_decode_beats_v3(db):
    def itl(name, prompt):
        return estimator.estimate(name, "h200", n_gpus=8, weight_format="fp8", batch=32, prompt_tokens=prompt,
                                  output_tokens=2, calibration="none", db=db).itl_s
    assert itl("deepseek-v3.2-exp", 2048) >= itl("deepseek-v3", 2048)   # the indexer costs a little at 2K
    assert itl("deepseek-v3.2-exp", 131072) < 0.6 * itl("deepseek-v3", 131072)


def test_deepseek_v32_prefill_pairs_are_capped(db):
    m = _columns(db, "deepseek-v3.2-exp")
    T = 8192
    capped = 2048 * 2049 / 2 + (T - 2048) * 2048
    assert _value(fl.prefill_pairs(m, T)) == 61 * capped
    assert _value(fl.indexer_pairs(m, T)) == 61 * T * (T + 1) / 2
    # past the top k the sparse kernel runs MLA absorbed: 2 x 128 x (2 x 512 + 64) FLOPs per pair
    expected = 61 * (2 * 128 * (2 * 512 + 64) * capped + 2 * 64 * 129 * T * (T + 1) / 2)
    assert _value(fl.prefill_flops(m, 1, T)["attention"]) == pytest.approx(expected, rel=1e-12)
    plain = _columns(db, "deepseek-v3")
    long = 65536
    assert _value(fl.prefill_flops(m, 1, long)["attention"]) < 0.5 * _value(fl.prefill_flops(plain, 1, long)["attention"])


# --- Gemma 3n: per-layer embeddings, KV sharing, AltUp, LAuReL ---------------------------------------------

@pytest.mark.parametrize("name, layers, table", [("gemma-3n-e4b", 35, 2_348_810_240), ("gemma-3n-e2b", 30, 2_013_265_920)])
def test_gemma3n_device_weights_leave_the_per_layer_table_in_host_memory(db, name, layers, table):
    counts, m = count_params(db.models.get(name)), _columns(db, name)
    assert counts.per_layer_embedding == 262_144 * layers * 256 == table
    f = format_columns([weight_format("bf16")])
    device = (counts.total - table) * BF16           # every other weight (the tied head once), norms included
    assert _value(tr.weight_bytes_stored(m, f)) == device
    assert _value(tr.host_embedding_bytes(m, f)) == table * BF16
    e = estimator.estimate(name, "h100", calibration="none", db=db)
    assert e.memory_weights_bytes == device
    # a decode step reads one row of the table per token: layers x 256 values at the embedding's bits
    rows = _value(tr.activation_bytes(m, f, 1)) - _value(tr.activation_bytes(
        {**m, "ple_elems_per_token": np.zeros(1)}, f, 1))
    assert rows == layers * 256 * BF16


def test_gemma3n_e4b_effective_count_by_hand(db):
    d, L, ple, n, r = 2048, 35, 256, 4, 64
    layer = (d * 8 * 256 + 2 * d * 2 * 256 + 8 * 256 * d          # attention
             + 3 * d * 16384                                      # gated MLP
             + 2 * d * ple                                        # per-layer input gate and projection
             + d * n + n ** 3 + n ** 2                            # AltUp router and coefficients
             + 2 * d * r                                          # LAuReL
             + 2 * d + d + 2 * d + d)                             # norms: 2 counted, per-layer, AltUp 2, LAuReL
    model = d * L * ple + 2 * (n - 1) * d * d + d + ple            # per-layer projection, AltUp in/out, norms
    assert count_params(db.models.get("gemma-3n-e4b")).total_as_published(False) == L * layer + model
    assert (L * layer + model) / 1e9 == pytest.approx(3.98, abs=0.005)


def test_gemma3n_kv_sharing_by_hand(db):
    m, f = _columns(db, "gemma-3n-e4b"), format_columns([weight_format("bf16")])
    per_layer = 2 * 2 * 256 * BF16
    assert _value(tr.kv_bytes_per_token(m, 16)) == 20 * per_layer == 40_960     # layers 0-19 hold a cache
    # of them 4 are full attention, 16 keep the last 512 tokens
    assert _value(kv_cache_bytes_per_sequence(m, 16, 4096, 1)) == per_layer * (4 * 4096 + 16 * 512)
    ledger = tr.decode_bytes(m, f, 16, 1, 4096.0, 512.0, 1, True)
    assert _value(ledger["kv_read"]) == per_layer * (7 * 4096 + 28 * 512)      # all 35 layers still attend
    assert _value(ledger["kv_write"]) == 20 * per_layer
    # the 15 sharing layers' K and V projections are stored, never multiplied
    unused = 15 * 2 * 2048 * 512
    assert count_params(db.models.get("gemma-3n-e4b")).unused == unused
    assert _value(fl.matmul_params_per_token(m)) == _value(m["params_dense_linear"]) - unused


# --- config.json ---------------------------------------------------------------------------------------------

def _base(**extra) -> dict:
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 1000,
           "max_position_embeddings": 4096}
    cfg.update(extra)
    return cfg


def _qwen3_next() -> dict:
    return _base(model_type="qwen3_next", full_attention_interval=4,
                 layer_types=["linear_attention"] * 3 + ["full_attention"], linear_num_key_heads=2,
                 linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
                 num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)


def _deepseek_v32() -> dict:
    return _base(model_type="deepseek_v32", kv_lora_rank=32, q_lora_rank=48, qk_rope_head_dim=8, qk_nope_head_dim=16,
                 v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                 n_shared_experts=1, first_k_dense_replace=1, index_topk=2048, index_n_heads=4, index_head_dim=16)


def _gemma3n() -> dict:
    text = _base(model_type="gemma3n_text", intermediate_size=[128] * 5, num_hidden_layers=5, sliding_window=512,
                 layer_types=["sliding_attention"] * 4 + ["full_attention"], hidden_size_per_layer_input=16,
                 vocab_size_per_layer_input=900, num_kv_shared_layers=2, altup_num_inputs=4, laurel_rank=8)
    return {"model_type": "gemma3n", "text_config": text}


def test_config_json_reads_each_mechanism():
    qwen = spec_from_config(_qwen3_next(), "tiny-qwen3-next", "file://test").shape
    la = qwen.linear_attention
    assert (la.full_attention_interval, la.num_key_heads, la.key_head_dim, la.num_value_heads, la.value_head_dim,
            la.conv_kernel_dim) == (4, 2, 16, 4, 16, 4)
    assert qwen.attention_output_gate and qwen.num_linear_layers == 3
    ds = spec_from_config(_deepseek_v32(), "tiny-v32", "file://test").shape.sparse_attention
    assert (ds.index_n_heads, ds.index_head_dim, ds.index_topk) == (4, 16, 2048)
    gemma = spec_from_config(_gemma3n(), "tiny-gemma3n", "file://test").shape
    assert (gemma.per_layer_embeddings.hidden_size_per_layer_input,
            gemma.per_layer_embeddings.vocab_size_per_layer_input) == (16, 900)
    # the last two layers (a sliding and the full one) share the cache
    assert (gemma.num_kv_shared_layers, gemma.num_kv_shared_local_layers, gemma.altup_num_inputs,
            gemma.laurel_rank, gemma.intermediate_size) == (2, 1, 4, 8, 128)
    defaults = spec_from_config(_base(model_type="deepseek_v32", kv_lora_rank=32, qk_rope_head_dim=8,
                                      qk_nope_head_dim=16, v_head_dim=16), "v32", "file://test")
    assert defaults.shape.sparse_attention.index_topk == 2048     # DeepseekV32Config defaults


REFUSED = {
    "hybrid layer_types": (lambda: _base(layer_types=["full_attention", "mamba", "full_attention", "mamba"]),
                           ["linear_attention_state"]),
    "recurrent layer_types": (lambda: _base(layer_types=["recurrent", "recurrent", "attention", "recurrent"]),
                              ["linear_attention_state"]),
    "jamba": (lambda: _base(model_type="jamba", attn_layer_period=8, num_experts=16, num_experts_per_tok=2),
              ["linear_attention_state"]),
    "linear keys of another kind": (lambda: _base(linear_num_key_heads=2, linear_key_head_dim=16),
                                    ["linear_attention_state"]),
}
MODELLED_CONFIGS = {"qwen3_next": _qwen3_next, "deepseek_v32": _deepseek_v32, "gemma3n": _gemma3n,
                    "index keys without the model_type": lambda: _base(index_topk=2048),
                    "per-layer input without the model_type": lambda: _base(hidden_size_per_layer_input=256)}


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_config_json_marks_a_mechanism_left(kind):
    make, expected = REFUSED[kind]
    assert unmodelled_mechanisms(make()) == expected
    spec = spec_from_config(make(), f"tiny-{kind}", "file://test")
    assert spec.unmodelled_mechanisms == expected
    with pytest.raises(ConfigurationError, match="other than Gated DeltaNet.*which the estimator does not model yet"):
        spec.require_modelled()


@pytest.mark.parametrize("kind", sorted(MODELLED_CONFIGS))
def test_config_json_of_a_modelled_mechanism_is_estimated(kind, db):
    cfg = MODELLED_CONFIGS[kind]()
    assert unmodelled_mechanisms(cfg) == []
    spec = spec_from_config(cfg, f"tiny-{kind}", "file://test").require_modelled()
    assert estimator.estimate(spec, "h100", calibration="none", db=db).itl_s > 0


def test_plain_configs_are_not_marked():
    for cfg in (_base(), _base(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128),
                _base(model_type="llama4_text", attention_chunk_size=8192)):
        assert unmodelled_mechanisms(cfg) == []
        assert spec_from_config(cfg, "plain", "file://test").require_modelled().unmodelled_mechanisms == []


def test_per_layer_ffn_widths_are_refused_by_name():
    assert spec_from_config(_gemma3n(), "tiny", "file://test").shape.intermediate_size == 128
    for cfg in (_base(intermediate_size=[128, 128, 64, 64]), _gemma3n()):
        if "text_config" in cfg:   # a MatFormer mix-n-match sub-model
            cfg["text_config"]["intermediate_size"] = [128, 128, 64, 64, 64]
        assert unmodelled_mechanisms(cfg) == ["per_layer_ffn_widths"]
        with pytest.raises(ConfigurationError, match="feed-forward widths that differ from layer to layer .*MatFormer"):
            spec_from_config(cfg, "tiny", "file://test")


@pytest.mark.parametrize("model_type", ["mamba", "rwkv"])
def test_a_config_without_attention_shapes_names_the_mechanism(model_type):
    cfg = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 1000}
    with pytest.raises(ConfigurationError, match="fixed-size recurrent state"):
        spec_from_config(cfg, f"tiny-{model_type}", "file://test")


def test_local_config_json_is_estimated_or_refused(tmp_path, db):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_next()))
    assert load_config_json(path).shape.linear_attention is not None
    assert estimator.estimate(str(path), "h100", calibration="none", db=db).fits
    path.write_text(json.dumps(REFUSED["jamba"][0]()))
    with pytest.raises(ConfigurationError, match="state-space or recurrent layers"):
        estimator.estimate(str(path), "h100", db=db)


# --- GGUF ----------------------------------------------------------------------------------------------------

def _tensors(w, i, names, rows_and_lengths):
    for name, (rows, length) in zip(names, rows_and_lengths):
        _quantized(w, f"blk.{i}.{name}.weight", rows, length, Q.Q8_0)


def build_qwen3next(path):
    """4 layers of d = 64: 3 Gated DeltaNet (2 key heads, 4 value heads of 16, conv 4), the 4th gated attention."""
    w = gguf.GGUFWriter(str(path), "qwen3next")
    _common(w, "qwen3next", layers=4, d_ff=128, ftype=7)
    w.add_expert_count(4)
    w.add_expert_used_count(2)
    w.add_expert_feed_forward_length(64)
    w.add_expert_shared_feed_forward_length(64)
    for add, value in ((w.add_ssm_conv_kernel, 4), (w.add_ssm_state_size, 16), (w.add_ssm_group_count, 2),
                       (w.add_ssm_time_step_rank, 4), (w.add_ssm_inner_size, 64), (w.add_full_attention_interval, 4)):
        add(value)
    _quantized(w, "token_embd.weight", 100, 64, Q.Q8_0)
    for i in range(4):
        if i == 3:   # q emits the query and its output gate: 2 x 4 heads x 16
            _tensors(w, i, ("attn_q", "attn_k", "attn_v", "attn_output"), ((128, 64), (32, 64), (32, 64), (64, 64)))
        else:
            _tensors(w, i, ("ssm_in", "ssm_out"), ((2 * 32 + 2 * 64, 64), (64, 64)))
            w.add_tensor(f"blk.{i}.ssm_ba.weight", np.zeros((8, 64), np.float32))
            w.add_tensor(f"blk.{i}.ssm_conv1d.weight", np.zeros((128, 4), np.float32))
            for name, size in (("ssm_a", 4), ("ssm_dt.bias", 4), ("ssm_norm.weight", 16)):
                w.add_tensor(f"blk.{i}.{name}", np.zeros(size, np.float32))
        for name in ("attn_norm", "post_attention_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(64, np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", np.zeros((4, 64), np.float32))
        for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            _quantized(w, f"blk.{i}.{name}.weight", 64, 64, Q.Q8_0, lead=(4,))
        _tensors(w, i, ("ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"), ((64, 64),) * 3)
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    _finish(w)
    return path


def build_gemma3n(path, widths=(128,) * 5):
    """5 layers of d = 64 (4 sliding, 1 full), the last 2 sharing KV; per-layer inputs of 32, AltUp 4, LAuReL 4."""
    w = gguf.GGUFWriter(str(path), "gemma3n")
    _common(w, "gemma3n", layers=5, d_ff=list(widths), ftype=7)
    w.add_sliding_window(512)
    w.add_sliding_window_pattern([True] * 4 + [False])
    w.add_shared_kv_layers(2)
    w.add_altup_num_inputs(4)
    w.add_embedding_length_per_layer_input(32)
    _quantized(w, "token_embd.weight", 100, 64, Q.Q8_0)
    _quantized(w, "per_layer_token_embd.weight", 90, 5 * 32, Q.Q8_0)   # 90 rows of 5 layers x 32
    w.add_tensor("per_layer_model_proj.weight", np.zeros((160, 64), np.float32))
    w.add_tensor("altup_proj.weight", np.zeros((3, 64, 64), np.float32))
    w.add_tensor("altup_unembd_proj.weight", np.zeros((3, 64, 64), np.float32))
    for i in range(5):
        _tensors(w, i, ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up"),
                 ((64, 64), (32, 64), (32, 64), (64, 64), (widths[i], 64), (widths[i], 64)))
        _quantized(w, f"blk.{i}.ffn_down.weight", 64, widths[i], Q.Q8_0)
        for name, shape in (("inp_gate", (32, 64)), ("proj", (64, 32)), ("laurel_l", (4, 64)), ("laurel_r", (64, 4)),
                            ("altup_router", (4, 64)), ("altup_predict_coef", (16, 4)), ("altup_correct_coef", (4, 4))):
            w.add_tensor(f"blk.{i}.{name}.weight", np.zeros(shape, np.float32))
        for name in ("attn_norm", "post_attention_norm", "ffn_norm", "post_ffw_norm"):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(64, np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    _finish(w)
    return path


def build_deepseek32(path):
    """deepseek2's tiny MLA layout (2 layers) plus a lightning indexer of 4 heads x 16, top-32."""
    w = gguf.GGUFWriter(str(path), "deepseek32")
    _common(w, "deepseek32", head_dim=0, ftype=7)
    w.add_kv_lora_rank(32)
    w.add_q_lora_rank(32)
    w.add_rope_dimension_count(16)
    w.add_key_length(48)
    w.add_value_length(32)
    w.add_indexer_head_count(4)
    w.add_indexer_key_length(16)
    w.add_indexer_top_k(32)
    _quantized(w, "token_embd.weight", 100, 64, Q.Q8_0)
    for i in range(2):
        _tensors(w, i, ("attn_q_a", "attn_q_b", "attn_kv_a_mqa", "attn_kv_b", "attn_output", "ffn_gate", "ffn_up",
                        "indexer.attn_q_b", "indexer.attn_k"),
                 ((32, 64), (4 * 48, 32), (32 + 16, 64), (4 * (32 + 32), 32), (64, 4 * 32), (256, 64), (256, 64),
                  (4 * 16, 32), (16, 64)))
        _quantized(w, f"blk.{i}.ffn_down.weight", 64, 256, Q.Q8_0)
        w.add_tensor(f"blk.{i}.indexer.proj.weight", np.zeros((4, 64), np.float32))
        for name, size in (("attn_norm", 64), ("ffn_norm", 64), ("attn_q_a_norm", 32), ("attn_kv_a_norm", 32),
                           ("indexer.k_norm", 16)):
            w.add_tensor(f"blk.{i}.{name}.weight", np.ones(size, np.float32))
    w.add_tensor("output_norm.weight", np.ones(64, np.float32))
    w.add_tensor("output.weight", np.zeros((100, 64), np.float16))
    _finish(w)
    return path


def test_gguf_qwen3next_reads_the_gated_deltanet_layers(tmp_path):
    spec = read_gguf(build_qwen3next(tmp_path / "q.gguf"), count_params)
    la = spec.shape.linear_attention
    assert (la.full_attention_interval, la.num_key_heads, la.key_head_dim, la.num_value_heads, la.value_head_dim,
            la.conv_kernel_dim) == (4, 2, 16, 4, 16, 4)
    assert spec.shape.attention_output_gate and spec.shape.num_attention_layers == 1
    m = model_columns([spec])
    assert _value(tr.kv_bytes_per_token(m, 16)) == 1 * 2 * 2 * 16 * BF16
    assert _value(m["state_elems_per_sequence"]) == 3 * (4 * 16 * 16 + 128 * 3)


def test_gguf_deepseek32_reads_the_indexer(tmp_path):
    spec = read_gguf(build_deepseek32(tmp_path / "d.gguf"), count_params)
    sa = spec.shape.sparse_attention
    assert (sa.index_n_heads, sa.index_head_dim, sa.index_topk) == (4, 16, 32)
    assert indexer_params_per_layer(spec.shape) == 32 * 64 + 64 * 16 + 2 * 16 + 64 * 4


def test_gguf_gemma3n_reads_per_layer_embeddings_sharing_altup_and_laurel(tmp_path):
    spec = read_gguf(build_gemma3n(tmp_path / "g.gguf"), count_params)
    s = spec.shape
    assert (s.per_layer_embeddings.hidden_size_per_layer_input, s.per_layer_embeddings.vocab_size_per_layer_input,
            s.num_kv_shared_layers, s.num_kv_shared_local_layers, s.altup_num_inputs, s.laurel_rank,
            s.num_local_layers) == (32, 90, 2, 1, 4, 4, 4)
    # both tables are Q8_0, so the device holds every stored byte but the per-layer table's
    table_bytes = 90 * 160 // 32 * 34
    m, f = model_columns([spec]), format_columns([spec.stored_format])
    assert _value(tr.host_embedding_bytes(m, f)) == pytest.approx(table_bytes, rel=1e-12)
    assert _value(tr.weight_bytes_stored(m, f)) == pytest.approx(spec.stored_weight_bytes - table_bytes, rel=1e-12)


def test_gguf_gemma3n_with_per_layer_widths_names_matformer(tmp_path):
    path = build_gemma3n(tmp_path / "g.gguf", widths=(128, 128, 64, 64, 64))
    with pytest.raises(ConfigurationError, match="feed_forward_length differs between layers .*MatFormer"):
        read_gguf(path, count_params)
