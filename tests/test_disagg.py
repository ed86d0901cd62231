"""Disaggregated prefill/decode pools against aggregated serving."""

from __future__ import annotations

import json

import pytest

from estimator.cli import main
from estimator.errors import ConfigurationError
from estimator.evaluation.api import estimate
from estimator.planning.disaggregation import aggregated, disaggregated, fewest_devices

COMMON = dict(weight_format="fp8", prompt_tokens=2048, output_tokens=256)


def test_ttft_is_queue_plus_prefill_plus_kv_transfer(db):
    r = disaggregated("llama-3.1-8b", "h100", 5.0, 1, 1, db=db, **COMMON)
    one = estimate("llama-3.1-8b", "h100", batch=1, db=db, **COMMON)
    u = 5.0 * one.ttft_s
    transfer = 2048 * 131072 / 450e9           # 2048 tokens x 128 KiB over NVLink 4 (450 GB/s one way)
    assert r["kv_transfer_s"] == pytest.approx(transfer)
    assert r["ttft_s"] == pytest.approx(one.ttft_s + u * one.ttft_s / (2 * (1 - u)) + transfer)


def test_decode_pool_has_no_prefill_stalls(db):
    disagg = disaggregated("llama-3.1-8b", "h100", 5.0, 1, 1, db=db, **COMMON)
    batch = disagg["decode_batch"]
    plain = estimate("llama-3.1-8b", "h100", batch=round(batch), db=db, **COMMON)
    assert disagg["itl_s"] == pytest.approx(plain.itl_s, rel=0.02)   # the bare step time: nothing stalls it
    agg = estimate("llama-3.1-8b", "h100", rate=5.0, db=db, **COMMON)
    stalled = estimate("llama-3.1-8b", "h100", batch=round(agg.steady_batch), db=db, **COMMON)
    assert agg.itl_s > stalled.itl_s * 1.05                           # aggregated: prefills interrupt decode


def test_saturation_is_flagged(db):
    r = disaggregated("llama-3.1-70b", "h100", 50.0, 2, 2, tp=2, db=db, **COMMON)
    assert r["saturated"] and r["ttft_s"] is None


def test_fewest_devices_meet_the_targets(db):
    best = fewest_devices("llama-3.1-8b", "l40s", 6.0, max_ttft_s=1.0, max_itl_s=0.05, max_devices=16, db=db,
                          **COMMON)
    for mode in ("aggregated", "disaggregated"):
        r = best[mode]
        assert r is not None and r["ttft_s"] <= 1.0 and r["itl_s"] <= 0.05
    devices = best["aggregated"]["devices"]
    assert devices > 1
    smaller = aggregated("llama-3.1-8b", "l40s", 6.0, devices - 1, db=db, **COMMON)
    assert smaller["saturated"] or smaller["ttft_s"] > 1.0 or smaller["itl_s"] > 0.05


def test_pool_sizes_must_hold_whole_instances(db):
    with pytest.raises(ConfigurationError, match="multiple of tp x pp = 2"):
        disaggregated("llama-3.1-70b", "h100", 1.0, 3, 2, tp=2, db=db, **COMMON)


def test_cli(capsys):
    argv = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--format", "fp8", "--rate", "4",
            "--prefill-gpus", "1", "--decode-gpus", "1", "--max-ttft-s", "0.5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "disaggregated" in out and "aggregated" in out and "Fewest devices" in out
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {"disaggregated", "aggregated", "fewest_devices"} <= data.keys()
    assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--prefill-gpus", "1"]) == 2
    assert "needs --prefill-gpus X, --decode-gpus Y and --rate R" in capsys.readouterr().err
