"""`roofline explain`: numbers in words, and changes ranked by re-estimating."""

from __future__ import annotations

import json

import pytest

from estimator.cli import main
from estimator.evaluation.api import estimate
from estimator.reporting.explain import explain


def test_changes_are_re_estimated_not_rules_of_thumb(db):
    kwargs = dict(model="llama-3.1-8b", gpu="rtx 4090", weight_format="bf16")
    data = json.loads(explain(kwargs, db=db, as_json=True))
    by_name = {c["change"]: c for c in data["changes"]}
    base = estimate(**kwargs, db=db)
    awq = estimate(**{**kwargs, "weight_format": "int4-awq"}, db=db)
    assert by_name["4-bit AWQ weights"]["decode_speedup"] == pytest.approx(
        awq.decode_tps_per_seq / base.decode_tps_per_seq)
    speedups = [c["decode_speedup"] for c in data["changes"]]
    assert speedups == sorted(speedups, reverse=True)


def test_explanation_names_bytes_bound_and_ridge(capsys):
    assert main(["explain", "--model", "llama-3.1-70b", "--gpu", "h200", "--format", "fp8", "--batch", "8"]) == 0
    out = capsys.readouterr().out
    for text in ("Each decode step moves", "GB of weights", "memory-bound", "ridge point", "What would help most",
                 "1. ", "2. "):
        assert text in out


def test_the_copies_an_engine_makes_of_its_cache_are_named(capsys):
    """ExLlamaV2 with a Q4 cache and no flash-attn widens and expands its cache before attention: the explanation
    names those copies apart from the cache attention reads (stored at 4.5 bits, 36 KiB a token); llama.cpp makes
    none."""
    args = ["explain", "--model", "llama-3-8b", "--gpu", "rtx 4090", "--format", "exl2-8bpw", "--prompt", "8192"]
    assert main([*args, "--engine", "exllamav2", "--kv-format", "q4", "--attention", "unfused"]) == 0
    out = capsys.readouterr().out
    assert "copying it before attention reads it" in out and "stored at 36 KiB per token" in out
    e = estimate("llama-3-8b", "rtx 4090", engine="exllamav2", weight_format="exl2-8bpw", kv_format="q4",
                 attention="unfused", prompt_tokens=8192, output_tokens=128)
    r = e.results
    assert r["decode_bytes_kv_expand"] > r["decode_bytes_kv_read"] > 0
    assert main([*args, "--engine", "llama.cpp", "--format", "Q8_0"]) == 0
    assert "copying it" not in capsys.readouterr().out


def test_a_configuration_that_does_not_fit_gets_the_changes_that_make_it_run(capsys):
    assert main(["explain", "--model", "llama-3.1-70b", "--gpu", "h100", "--format", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "it cannot run" in out and "Changes that make it run" in out and "2 devices" in out


def test_offload_is_explained(capsys):
    assert main(["explain", "--model", "mixtral-8x7b", "--gpu", "rtx 4090", "--format", "Q4_K_M",
                 "--offload", "auto"]) == 0
    out = capsys.readouterr().out
    assert "live in host memory" in out and "offload-bound" in out


def test_attention_dp_is_offered_where_tensor_parallelism_copies_the_kv_cache(db):
    """DeepSeek-V3 at 1,500 sequences on 8 x H200 does not fit under TP (its latent on all 8 ranks); attention
    DP over the same ranks makes it run. Llama-3.1-70B's 8 KV heads split over 8 ranks: nothing to offer."""
    kwargs = dict(model="deepseek-v3", gpu="h200", n_gpus=8, weight_format="fp8", batch=1500, prompt_tokens=1000,
                  output_tokens=1000)
    changes = json.loads(explain(kwargs, db=db, as_json=True))["changes"]
    dep = next(c for c in changes if c["change"].startswith("attention data-parallel"))
    assert not estimate(**kwargs, db=db).fits
    assert dep["decode_tps_per_seq"] == pytest.approx(
        estimate(**kwargs, attention_dp=True, ep=8, db=db).decode_tps_per_seq)
    dense = json.loads(explain(dict(model="llama-3.1-70b", gpu="h100", n_gpus=8), db=db, as_json=True))["changes"]
    assert not any(c["change"].startswith("attention data-parallel") for c in dense)
