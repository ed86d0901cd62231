"""Properties that hold for every configuration (hypothesis), and sweep == loop of estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from estimator.evaluation.api import estimate, sweep
from estimator.specs.database import load_database
from estimator.specs.formats import WEIGHT_FORMATS, weight_format
from tests.helpers import run

DB = load_database()
MODELS = sorted(m.name for m in DB.models)
GPUS = sorted(h.name for h in DB.hardware)
FORMATS = [f.name for f in WEIGHT_FORMATS]

configs = st.fixed_dictionaries({
    "model": st.sampled_from(MODELS),
    "gpu": st.sampled_from(GPUS),
    "fmt": st.sampled_from(FORMATS),
    "B": st.integers(1, 512),
    "T": st.integers(1, 65536),
    "O": st.integers(1, 4096),
})
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TIMES = ("ttft_s", "itl_s", "e2e_latency_s")


def _run(c, ideal=False, **overrides):
    hw = DB.hardware.get(c["gpu"])
    assume(any(hw.peak_flops_per_s(d) for d in weight_format(c["fmt"]).compute_dtypes))
    return run(DB.models.get(c["model"]), DB.hardware.get(c["gpu"]), fmt=c["fmt"], B=c["B"], T=c["T"], O=c["O"],
               ideal=ideal, **overrides)


@SETTINGS
@given(configs)
def test_results_are_finite_and_positive(c):
    r = _run(c)
    for key in ("itl_s", "decode_tps_per_seq", "decode_tps_total", "e2e_latency_s", "memory_required_bytes"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    assert r["ttft_s"] >= 0 and math.isfinite(r["ttft_s"])
    assert r["max_batch"] >= 0


@SETTINGS
@given(configs, st.floats(1.01, 4.0))
def test_more_bandwidth_is_never_slower(c, factor):
    base = _run(c)
    faster = _run(c, bandwidth_bytes_per_s=DB.hardware.get(c["gpu"]).memory_bandwidth_bytes_per_s * factor)
    for key in TIMES:
        assert faster[key] <= base[key] * (1 + 1e-12)


@SETTINGS
@given(configs, st.floats(1.01, 4.0))
def test_more_parameters_are_never_faster(c, factor):
    spec = DB.models.get(c["model"])
    from estimator.evaluation.columns import model_columns
    dense = float(model_columns([spec])["params_dense_linear"][0])
    base = _run(c)
    bigger = _run(c, params_dense_linear=dense * factor)
    for key in TIMES:
        assert bigger[key] >= base[key] * (1 - 1e-12)
    assert bigger["memory_weights_bytes"] > base["memory_weights_bytes"]


@SETTINGS
@given(configs, st.floats(1.01, 3.0))
def test_more_bits_are_never_faster(c, factor):
    base = _run(c)
    f = weight_format(c["fmt"])
    wider = _run(c, expert_bits=f.linear_bits * factor, dense_bits=(16 if f.experts_only else f.linear_bits) * factor)
    for key in TIMES:
        assert wider[key] >= base[key] * (1 - 1e-12)


@SETTINGS
@given(configs, st.integers(1, 8192))
def test_longer_prompts_are_never_faster(c, extra):
    base = _run(c)
    longer = _run({**c, "T": c["T"] + extra})
    for key in TIMES:
        assert longer[key] >= base[key] * (1 - 1e-12)


@SETTINGS
@given(configs)
def test_halving_bandwidth_doubles_memory_bound_time(c):
    base = _run(c, ideal=True)
    if base["decode_linear_s"] + base["decode_attention_s"] != pytest.approx(base["decode_memory_s"], rel=1e-12):
        return  # only when both kernel groups are memory-bound
    half = _run(c, ideal=True, bandwidth_bytes_per_s=DB.hardware.get(c["gpu"]).memory_bandwidth_bytes_per_s / 2)
    assert half["itl_s"] == pytest.approx(2 * base["itl_s"], rel=1e-9)


@SETTINGS
@given(configs)
def test_ledgers_sum_to_their_totals(c):
    r = _run(c)
    for ledger in ("prefill_flops", "prefill_bytes", "decode_flops", "decode_bytes"):
        terms = [v for k, v in r.items() if k.startswith(ledger + "_") and not k.endswith("_total")]
        assert sum(terms) == pytest.approx(r[f"{ledger}_total"], rel=1e-12)


def test_sweep_equals_a_loop_of_estimates():
    models, gpus, fmts = ["llama-3.1-8b", "mixtral-8x7b"], ["h100", "rtx 4090", "m2 ultra"], ["bf16", "Q4_K_M"]
    batches, prompts, outputs = [1, 16], [128, 4096], [64]
    table = sweep(models, gpus, fmts, ["f16", "fp8"], batches, prompts, outputs, [1])
    assert table.labels["layout"] == ["tp1 pp1 ep1 dp1"]
    assert len(table) == 2 * 3 * 2 * 2 * 2 * 2
    i = 0
    for model in models:
        for gpu in gpus:
            for fmt in fmts:
                for kv in ["f16", "fp8"]:
                    for b in batches:
                        for p in prompts:
                            one = estimate(model, gpu, weight_format=fmt, kv_format=kv, batch=b,
                                           prompt_tokens=p, output_tokens=64)
                            for key in ("ttft_s", "itl_s", "memory_required_bytes", "max_batch"):
                                assert table.columns[key][i] == pytest.approx(getattr(one, key), rel=1e-12)
                            assert table.row(i)["model"] == one.model.name
                            i += 1


def test_sweep_converts_to_pandas():
    df = sweep(["llama-3.1-8b"], ["h100", "a100"], batches=[1, 8]).to_pandas()
    assert list(df["hardware"].unique()) == [DB.hardware.get("h100").name, DB.hardware.get("a100").name]
    assert set(df["decode_bound"].astype(str)) <= {"memory", "compute", "overhead"}
    assert np.all(df["decode_tps_total"] >= df["decode_tps_per_seq"])


@SETTINGS
@given(configs)
def test_offload_is_never_faster_than_fitting(c):
    from estimator.physics.offload import STREAM
    base = _run(c)
    streamed = _run(c, serving={"offload": STREAM})
    assert streamed["itl_s"] >= base["itl_s"] * (1 - 1e-12)
    assert streamed["offload_slowdown"] >= 1 - 1e-12


@SETTINGS
@given(configs, st.integers(1, 8), st.floats(0.0, 0.3))
def test_zero_acceptance_speculation_is_never_faster(c, gamma, cost):
    plain = _run(c)
    spec = _run(c, serving={"spec_tokens": gamma, "acceptance": 0.0, "draft_cost": cost})
    assert spec["itl_s"] >= plain["itl_s"] * (1 - 1e-12)
