"""Reading a real config.json gives the same shapes as the curated database entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from estimator.errors import DatabaseError
from estimator.specs.config_json import load_config_json, spec_from_config

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
PAIRS = {  # fixture -> database entry
    "llama-3.1-8b.json": "llama-3.1-8b",
    "qwen3-30b-a3b.json": "Qwen/Qwen3-30B-A3B",
    "deepseek-v3.json": "deepseek-ai/DeepSeek-V3",
    "gpt-oss-20b.json": "openai/gpt-oss-20b",
}


@pytest.mark.parametrize("fixture, entry", sorted(PAIRS.items()))
def test_config_json_matches_database_shape(db, fixture, entry):
    assert load_config_json(FIXTURES / fixture).shape == db.models.get(entry).shape


def test_a_folder_holding_config_json_works(tmp_path):
    (tmp_path / "config.json").write_text((FIXTURES / "llama-3.1-8b.json").read_text())
    assert load_config_json(tmp_path).shape.num_kv_heads == 8


def _llama4_text():
    return {"model_type": "llama4_text", "hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40,
            "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
            "vocab_size": 202048, "max_position_embeddings": 10485760, "num_local_experts": 16,
            "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "attention_chunk_size": 8192}


def test_llama4_has_one_shared_expert_and_chunked_layers(db):
    spec = spec_from_config({"model_type": "llama4", "text_config": _llama4_text()}, "scout", "file://test")
    expected = db.models.get("meta-llama/Llama-4-Scout-17B-16E-Instruct").shape
    assert spec.shape.moe == expected.moe
    assert (spec.shape.sliding_window, spec.shape.num_local_layers) == (8192, 36)


def test_gemma2_alternates_and_ties_by_default():
    cfg = {"model_type": "gemma2", "hidden_size": 3584, "num_hidden_layers": 42, "num_attention_heads": 16,
           "num_key_value_heads": 8, "head_dim": 256, "intermediate_size": 14336, "vocab_size": 256000,
           "max_position_embeddings": 8192, "sliding_window": 4096}
    shape = spec_from_config(cfg, "g2", "file://test").shape
    assert shape.num_local_layers == 21 and shape.tie_word_embeddings is True
    assert shape.attention_logit_softcap == 50.0   # Gemma2Config's default cap


def test_an_attention_logit_soft_cap_is_read_and_a_null_means_none():
    cfg = {"model_type": "gemma2", "hidden_size": 2304, "num_hidden_layers": 26, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216, "vocab_size": 256000,
           "max_position_embeddings": 8192, "sliding_window": 4096}
    assert spec_from_config({**cfg, "attn_logit_softcapping": 30.0}, "g", "file://t").shape.attention_logit_softcap \
        == 30.0
    assert spec_from_config({**cfg, "attn_logit_softcapping": None}, "g", "file://t").shape.attention_logit_softcap \
        is None
    llama = {**cfg, "model_type": "llama"}
    assert spec_from_config(llama, "l", "file://t").shape.attention_logit_softcap is None


def test_zero_shared_expert_width_means_none():
    cfg = json.loads((FIXTURES / "qwen3-30b-a3b.json").read_text())
    cfg["shared_expert_intermediate_size"] = 0
    assert spec_from_config(cfg, "q", "file://test").shape.moe.num_shared_experts == 0


def test_unreadable_config_says_what_to_do(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mystery", "hidden_size": 10}))
    with pytest.raises(DatabaseError, match="cannot read model shapes.*write a models_db YAML entry"):
        load_config_json(tmp_path / "config.json")
    with pytest.raises(DatabaseError, match="cannot read"):
        load_config_json(tmp_path / "missing.json")
