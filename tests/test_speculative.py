"""Speculative decoding against the paper's formulas, and its fading benefit at large batch."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from estimator.evaluation.api import estimate, speculative_speedup_grid
from estimator.physics.speculative import expected_tokens, leviathan_speedup


@pytest.mark.parametrize("alpha, gamma, tokens", [(0.0, 4, 1.0), (1.0, 4, 5.0), (0.5, 1, 1.5), (0.8, 2, 2.44)])
def test_expected_tokens(alpha, gamma, tokens):
    assert expected_tokens(alpha, gamma) == pytest.approx(tokens)


def test_paper_example_table():
    # Leviathan et al. (docs/formulas.md §10): c = 0.05, α = 0.8 -> 1.71, 2.22, 2.57, 2.80, 2.95 for γ = 1..5
    got = [leviathan_speedup(0.8, g, 0.05) for g in range(1, 6)]
    assert got == pytest.approx([1.71, 2.22, 2.57, 2.80, 2.95], abs=0.01)


def test_memory_bound_speedup_matches_the_paper(db):
    # batch 1 is memory-bound, so verifying 5 tokens costs about one step: the estimate should land
    # within a few percent of the paper's formula with the same draft cost ratio
    kwargs = dict(n_gpus=2, weight_format="bf16", batch=1)
    plain = estimate("llama-3.1-70b", "h100", **kwargs)
    spec = estimate("llama-3.1-70b", "h100", draft_cost=0.05, draft_tokens=4, acceptance=0.8, **kwargs)
    assert spec.speculative_speedup == pytest.approx(leviathan_speedup(0.8, 4, 0.05), rel=0.05)
    assert spec.decode_tps_per_seq == pytest.approx(plain.decode_tps_per_seq * spec.speculative_speedup)


def test_benefit_shrinks_as_the_batch_grows(db):
    speedups = [estimate("llama-3.1-8b", "h100", draft_cost=0.05, draft_tokens=4, acceptance=0.7, batch=b,
                         prompt_tokens=256, output_tokens=128).speculative_speedup for b in (1, 32, 256, 1024)]
    assert speedups[0] > 2 and all(a > b for a, b in zip(speedups, speedups[1:]))
    assert speedups[-1] < 1   # compute-bound: verifying 5 tokens costs ~5 steps for ~2.8 tokens


def test_zero_acceptance_is_never_faster(db):
    for batch in (1, 64):
        spec = estimate("llama-3.1-8b", "rtx 4090", weight_format="Q4_K_M", draft_model="llama-3.2-1b",
                        draft_tokens=3, acceptance=0.0, batch=batch)
        assert spec.speculative_speedup < 1


def test_draft_model_memory_is_counted(db):
    plain = estimate("llama-3.1-8b", "l4")
    spec = estimate("llama-3.1-8b", "l4", draft_model="llama-3.2-1b", draft_tokens=4)
    assert spec.memory_weights_bytes - plain.memory_weights_bytes == pytest.approx(1.24e9 * 2, rel=0.03)
    assert spec.max_batch < plain.max_batch


def test_speedup_grid_and_plot():
    import matplotlib.pyplot as plt

    from estimator.reporting.plots import plot_speculative_speedup
    alphas, gammas = np.linspace(0, 0.95, 6), [1, 2, 4, 8]
    grid = speculative_speedup_grid("llama-3.1-70b", "h100", alphas, gammas, n_gpus=2, draft_cost=0.05)
    assert grid.shape == (4, 6)
    assert np.all(np.diff(grid, axis=1) > 0)          # more acceptance, more speed-up
    assert grid[-1, 0] < grid[0, 0]                   # at α = 0 longer drafts only cost
    fig, ax = plt.subplots()
    artists = plot_speculative_speedup(ax, alphas, gammas, grid, title="Llama-3.1-70B on 2 x H100")
    assert len(artists) == 5 and ax.get_xlabel().startswith("acceptance")
    plt.close(fig)


@pytest.mark.parametrize("options", [
    {"draft_model": "llama-3.2-1b", "batch": 8, "n_gpus": 2},                        # a draft model, a fixed batch
    {"draft_cost": 0.05, "concurrency": 16, "n_gpus": 2},                            # heads, closed-loop load
    {"draft_cost": 0.1, "rate": 0.5, "n_gpus": 2, "engine": "vLLM"},                # open-loop load, an engine
])
def test_the_vectorized_grid_is_a_loop_of_estimates(options):
    alphas, gammas = [0.0, 0.6, 0.9], [1, 4]
    grid = speculative_speedup_grid("llama-3.1-70b", "h100", alphas, gammas, **options)
    for i, g in enumerate(gammas):
        for j, a in enumerate(alphas):
            one = estimate("llama-3.1-70b", "h100", draft_tokens=g, acceptance=a, **options)
            assert grid[i, j] == pytest.approx(one.speculative_speedup, rel=1e-12), (g, a)


def test_serving_options_of_one_sweep_differ_only_in_per_row_fields():
    from estimator.errors import ConfigurationError
    from estimator.evaluation.api import sweep
    from estimator.serving.workload import ServingOptions
    cases = [ServingOptions(draft_cost=0.05, draft_tokens=g, acceptance=0.7) for g in (2, 4)]
    table = sweep(["llama-3.1-8b"], ["h100"], batches=[1, 32], serving=cases, detail=True)
    assert table.labels["serving"] == ["draft_tokens=2", "draft_tokens=4"]
    assert [table.row(i)["serving"] for i in range(len(table))] == table.labels["serving"] * 2   # serving is last
    with pytest.raises(ConfigurationError, match="may differ only in"):
        sweep(["llama-3.1-8b"], ["h100"], serving=[ServingOptions(), ServingOptions(kv_alloc="contiguous")])


def test_speculation_command_prints_the_grid_and_saves_the_plot(tmp_path, capsys):
    from estimator.cli import main
    out = tmp_path / "spec.png"
    assert main(["speculation", "--model", "llama-3.1-8b", "--gpu", "l4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "γ = 4" in text and "α=0.8" in text and out.stat().st_size > 10_000
    assert main(["speculation", "--model", "llama-3.1-8b", "--gpu", "l4", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err


def test_the_grid_says_what_load_it_was_evaluated_under(capsys):
    from estimator.cli import main
    for flags, said in (([], "batch 1"), (["--concurrency", "16"], "16 clients"), (["--rate", "0.5"], "0.5 requests/s")):
        assert main(["speculation", "--model", "qwen2.5-0.5b", "--gpu", "l4", *flags]) == 0
        assert f"l4, {said}, draft" in capsys.readouterr().out.splitlines()[0]
