"""Models that need a mechanism the schema lacks load, list and show, but estimating them is refused.

The refusal names the mechanism in words (ModelSpec.require_modelled), and the config.json reader marks
such configs itself (estimator.specs.config_json.unmodelled_mechanisms), so a local checkpoint of one is
refused too instead of being estimated as a plain transformer.
"""

from __future__ import annotations

import json

import pytest

import estimator
from estimator.cli import main
from estimator.errors import ConfigurationError, DatabaseError
from estimator.physics.params import count_params
from estimator.specs.config_json import load_config_json, spec_from_config, unmodelled_mechanisms
from estimator.specs.model import MECHANISMS, ModelSpec

# entry -> (mechanisms, words the refusal must contain)
UNMODELLED = {
    "Qwen3-Next-80B-A3B": (["linear_attention_state"], ["Gated DeltaNet", "fixed-size recurrent state"]),
    "DeepSeek-V3.2-Exp": (["sparse_attention"], ["DeepSeek Sparse Attention", "top-k"]),
    "Gemma-3n-E4B": (["per_layer_embeddings", "kv_cache_sharing"], ["per-layer embeddings", "KV-cache sharing"]),
    "Gemma-3n-E2B": (["per_layer_embeddings", "kv_cache_sharing"], ["per-layer embeddings", "KV-cache sharing"]),
}
NEW_ENTRIES = [*UNMODELLED, "Mistral-Small-3-24B"]


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_database_holds_at_least_80_models(db):
    assert len(db.models) >= 80


@pytest.mark.parametrize("name", NEW_ENTRIES)
def test_new_entry_loads_with_a_published_count(db, name):
    spec = db.models.get(name)
    assert spec.published_params is not None and spec.published_params.source.startswith("http")
    assert spec.config_source.startswith("https://huggingface.co/")
    assert count_params(spec).total > 0


@pytest.mark.parametrize("name", sorted(UNMODELLED))
def test_entry_names_its_mechanisms_and_is_not_count_checked(db, name):
    spec = db.models.get(name)
    assert spec.unmodelled_mechanisms == UNMODELLED[name][0]
    assert not spec.published_params_checked


@pytest.mark.parametrize("name", sorted(UNMODELLED))
def test_require_modelled_refuses_naming_the_mechanism(db, name):
    with pytest.raises(ConfigurationError) as info:
        db.models.get(name).require_modelled()
    message = str(info.value)
    assert message.startswith(f"{name} uses ")
    assert "which the estimator does not model yet" in message
    assert "estimating it as a plain transformer would be wrong" in message
    assert "\n" not in message
    for words in UNMODELLED[name][1]:
        assert words in message


@pytest.mark.parametrize("name", sorted(UNMODELLED))
def test_estimate_refuses_naming_the_mechanism(db, name):
    """Holds once estimator/evaluation/api.py resolves specs through ModelSpec.require_modelled."""
    with pytest.raises(ConfigurationError, match="does not model yet"):
        estimator.estimate(name, "h100", db=db)


def test_sweep_refuses_a_model_among_others(db):
    with pytest.raises(ConfigurationError, match="Qwen3-Next-80B-A3B uses linear-attention"):
        estimator.sweep(["llama-3.1-8b", "qwen3-next"], ["h100"], db=db)


def test_an_ordinary_model_passes_through(db):
    spec = db.models.get("Mistral-Small-3-24B")
    assert spec.unmodelled_mechanisms == [] and spec.published_params_checked
    assert spec.require_modelled() is spec
    assert spec.unmodelled_message() is None
    assert spec.shape.max_context == 32768
    assert estimator.estimate("mistral-small-3", "h100", db=db).fits


def test_mistral_small_3_differs_from_3_1_only_in_context(db):
    old, new = db.models.get("mistral-small-3.1"), db.models.get("mistral-small-24b-2501")
    assert new.shape.model_copy(update={"max_context": old.shape.max_context}) == old.shape


def test_every_mechanism_has_words_and_a_repeat_is_refused(db):
    assert set(MECHANISMS) == {"linear_attention_state", "sparse_attention", "per_layer_embeddings",
                               "kv_cache_sharing"}
    data = db.models.get("qwen3-next").model_dump()
    with pytest.raises(ValueError, match="more than once"):
        ModelSpec(**{**data, "unmodelled_mechanisms": ["sparse_attention", "sparse_attention"]})
    with pytest.raises(ValueError):
        ModelSpec(**{**data, "unmodelled_mechanisms": ["telepathy"]})


def test_list_and_show_include_them(capsys):
    code, out, _ = cli(capsys, "list", "models")
    assert code == 0
    for name in NEW_ENTRIES:
        assert name in out
    code, out, _ = cli(capsys, "show", "model", "gemma-3n-e4b")
    assert code == 0 and "per_layer_embeddings" in out and "params total (computed)" in out


def test_check_passes_and_says_which_counts_are_unchecked(capsys):
    code, out, _ = cli(capsys, "check")
    assert code == 0
    assert "model entries: all valid" in out
    assert "4 models use mechanisms the schema does not model" in out
    assert "(unchecked)" in out


def test_cli_estimate_exits_2_with_one_line(capsys):
    code, out, err = cli(capsys, "estimate", "--model", "deepseek-v3.2-exp", "--gpu", "h200", "--gpus", "8")
    assert code == 2 and out == ""
    assert err.strip().count("\n") == 0 and "sparse attention" in err


# --- config.json: each kind, from small hand-made configs -------------------------------------------------

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


CONFIGS = {
    "qwen3_next": (_qwen3_next, ["linear_attention_state"]),
    "deepseek_v32": (_deepseek_v32, ["sparse_attention"]),
    "gemma3n": (_gemma3n, ["per_layer_embeddings", "kv_cache_sharing"]),
    "hybrid layer_types": (lambda: _base(layer_types=["full_attention", "mamba", "full_attention", "mamba"]),
                           ["linear_attention_state"]),
    "recurrent layer_types": (lambda: _base(layer_types=["recurrent", "recurrent", "attention", "recurrent"]),
                              ["linear_attention_state"]),
    "jamba": (lambda: _base(model_type="jamba", attn_layer_period=8, num_experts=16, num_experts_per_tok=2),
              ["linear_attention_state"]),
    "index keys without the model_type": (lambda: _base(index_topk=2048), ["sparse_attention"]),
    "per-layer input without the model_type": (lambda: _base(hidden_size_per_layer_input=256),
                                               ["per_layer_embeddings"]),
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_config_json_marks_the_mechanism(kind):
    make, expected = CONFIGS[kind]
    cfg = make()
    assert unmodelled_mechanisms(cfg) == expected
    spec = spec_from_config(cfg, f"tiny-{kind}", "file://test")
    assert spec.unmodelled_mechanisms == expected
    with pytest.raises(ConfigurationError, match="which the estimator does not model yet"):
        spec.require_modelled()


def test_plain_configs_are_not_marked():
    for cfg in (_base(), _base(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128),
                _base(model_type="llama4_text", attention_chunk_size=8192)):
        assert unmodelled_mechanisms(cfg) == []
        assert spec_from_config(cfg, "plain", "file://test").require_modelled().unmodelled_mechanisms == []


def test_per_layer_widths_are_read_when_equal():
    assert spec_from_config(_gemma3n(), "tiny", "file://test").shape.intermediate_size == 128
    with pytest.raises(DatabaseError, match="intermediate_size differs between layers"):
        spec_from_config(_base(intermediate_size=[128, 128, 64, 64]), "tiny", "file://test")
    uneven = _gemma3n()   # shapes that cannot be read: the error names the mechanism, not the key
    uneven["text_config"]["intermediate_size"] = [128, 128, 64, 64, 64]
    with pytest.raises(ConfigurationError, match="per-layer embeddings"):
        spec_from_config(uneven, "tiny", "file://test")


@pytest.mark.parametrize("model_type", ["mamba", "rwkv"])
def test_a_config_without_attention_shapes_names_the_mechanism(model_type):
    cfg = {"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 1000}
    with pytest.raises(ConfigurationError, match="fixed-size recurrent state"):
        spec_from_config(cfg, f"tiny-{model_type}", "file://test")


def test_local_config_json_is_refused_by_estimate(tmp_path, db):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_qwen3_next()))
    assert load_config_json(path).unmodelled_mechanisms == ["linear_attention_state"]
    with pytest.raises(ConfigurationError, match="linear-attention"):
        estimator.estimate(str(path), "h100", db=db)
