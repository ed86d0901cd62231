"""`roofline predict` evaluates rows that differ only in their cached prefix, attention or micro-batch in one
vectorized call (ServingOptions.PER_ROW_COLUMNS): each must come out exactly as it does evaluated alone."""

from __future__ import annotations

from estimator.serving.workload import PER_ROW_COLUMNS, ServingOptions
from estimator.validation.predict import predict_rows, resolve_rows
from estimator.validation.resolved import _prepared_groups

BASE = {"hardware": "NVIDIA GeForce RTX 4090", "n_gpus": "1", "model": "meta-llama/Llama-3.1-8B", "engine": "llama.cpp",
        "framework": "llama.cpp", "backend": "cuda", "weight_format": "Q4_K_M", "batch": "1"}


def _rows() -> list[dict]:
    rows = []
    for depth in ("", "4096", "16384"):
        for attention in ("fused", "unfused"):
            for metric, prompt, output in (("decode_tps_per_seq", "0", "128"), ("prefill_tps", "512", "0")):
                rows.append({**BASE, "id": f"r{len(rows)}", "context_depth": depth, "attention": attention,
                             "metric": metric, "input_len": prompt, "output_len": output})
    return rows


def test_rows_differing_in_per_row_options_share_one_call(db):
    resolved, _ = resolve_rows(_rows(), db)
    assert len(set(resolved.serving)) == 6 and len(_prepared_groups(resolved, False)) == 1


def test_each_row_is_predicted_as_it_is_alone(db):
    rows = _rows()
    together = predict_rows(rows, db)
    for row, result in zip(rows, together):
        alone = predict_rows([row], db)[0]
        assert result["status"] == alone["status"] and result["predicted"] == alone["predicted"], row["id"]
        assert (result["predicted_low"], result["predicted_high"]) == (alone["predicted_low"], alone["predicted_high"])
    # the options really change the answer: a 16k-token context decodes slower than an empty one
    decode = [r for r, x in zip(together, rows) if x["metric"] == "decode_tps_per_seq" and x["attention"] == "fused"]
    assert float(decode[0]["predicted"]) > float(decode[-1]["predicted"])


def test_shared_options_drop_only_the_per_row_fields():
    options = ServingOptions(prefix_tokens=512, attention="unfused", ubatch_tokens=2048, concurrency=4)
    shared = options.shared()
    assert shared == ServingOptions(concurrency=4)
    columns = ServingOptions.stacked_columns([options, shared])
    assert set(PER_ROW_COLUMNS.values()) <= set(columns)
    assert list(columns["prefix_tokens"]) == [512.0, 0.0] and list(columns["fused_attention"]) == [False, True]
    assert columns["concurrency"] == 4.0
