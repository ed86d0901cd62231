"""Parameter counts from shapes: hand-worked examples and every published count."""

import pytest

from estimator.physics.params import attention_params_per_layer, count_params
from estimator.specs.database import load_database


def test_llama_2_7b_by_hand(db):
    # d=4096, L=32, MHA 32x128, d_ff=11008, V=32000 untied
    attention = 4 * 4096 * 4096
    mlp = 3 * 4096 * 11008
    norms = 2 * 4096
    expected = 32 * (attention + mlp + norms) + 4096 + 2 * 32000 * 4096
    assert count_params(db.models.get("llama-2-7b")).total == expected == 6_738_415_616


def test_mixtral_active_counts_two_of_eight_experts(db):
    counts = count_params(db.models.get("mixtral-8x7b"))
    assert counts.total / 1e9 == pytest.approx(46.7, rel=0.01)
    assert counts.active / 1e9 == pytest.approx(12.9, rel=0.01)
    assert counts.routed_expert_one == 3 * 4096 * 14336


def test_deepseek_v3_mla_and_moe(db):
    counts = count_params(db.models.get("deepseek-ai/DeepSeek-V3"))
    assert counts.total / 1e9 == pytest.approx(671, rel=0.01)
    assert counts.active / 1e9 == pytest.approx(37, rel=0.02)
    assert counts.num_moe_layers == 61 - 3


def test_head_dim_comes_from_config_not_hidden_over_heads(db):
    # Qwen3-8B: hidden 4096, 32 heads, but head_dim 128 and 8 KV heads -- and Qwen3-4B:
    # hidden 2560, 32 heads -> hidden/heads = 80, config head_dim = 128 (LMCache #688).
    shape = db.models.get("Qwen/Qwen3-4B").shape
    assert shape.head_dim == 128 != shape.hidden_size // shape.num_attention_heads
    q_and_o = 2 * shape.hidden_size * shape.num_attention_heads * shape.head_dim
    kv = 2 * shape.hidden_size * shape.num_kv_heads * shape.head_dim
    assert attention_params_per_layer(shape) == q_and_o + kv


def _published(db):
    return [m for m in db.models if m.published_params is not None]


def test_every_model_has_a_published_count(db):
    assert len(_published(db)) == len(db.models)


# A model with unmodelled mechanisms (ModelSpec.unmodelled_mechanisms) has shapes that leave out parameters;
# roofline check shows its comparison as unchecked. Gemma 3n publishes 'effective' counts without its embedding
# tables (total_includes_embeddings false), which the comparison follows.
@pytest.mark.parametrize("name", [m.name for m in load_database().models if m.published_params_checked])
def test_counts_match_published_within_two_percent(db, name):
    spec = db.models.get(name)
    counts, published = count_params(spec), spec.published_params
    total = counts.total_as_published(published.total_includes_embeddings)
    assert total / 1e9 == pytest.approx(published.total_billion, rel=0.02)
    if published.active_billion is not None:
        active = counts.active_as_published(published.active_includes_embedding)
        assert active / 1e9 == pytest.approx(published.active_billion, rel=0.02)
