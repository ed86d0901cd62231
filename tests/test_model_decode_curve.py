"""A calibration that times a model's own decode matrices, and estimates that read that model's curve.

On a CPU the rate a skinny GEMM streams its weights at depends on the matrix: Qwen2.5-0.5B's output head
(151,936 x 896) streams at about half the calibration shape's rate at 4 rows (docs/formulas.md §13), so a
model's own curve replaces the calibration shape's for that model's estimates."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from calibrate.decoder import decode_matrices
from calibrate.fit import model_stream
from estimator.specs.database import load_database

DB = load_database()


def test_the_decode_matrices_of_llama_3_1_8b():
    """Hand-worked: 32 layers of Q and O (4096 x 4096), K and V (1024 x 4096), gate and up (14336 x 4096) and
    down (4096 x 14336), and the 128,256-row head; together every weight but the embedding and the norms."""
    shape = DB.models.get("llama-3.1-8b").shape
    got = {(n, k): c for n, k, c in decode_matrices(shape)}
    assert got == {(4096, 4096): 64, (1024, 4096): 64, (14336, 4096): 64, (4096, 14336): 32, (128256, 4096): 1}
    from estimator.physics.params import count_params
    p = count_params(shape)
    assert sum(n * k * c for (n, k), c in got.items()) == p.total - p.embedding - p.norms


def test_a_mixture_of_experts_has_no_decode_matrices():
    assert decode_matrices(DB.models.get("qwen3-30b-a3b").shape) == ()


def _timed(model, m, n, k, count, seconds, ok=True):
    return {"bench": "model_matmul", "model": model, "dtype": "fp32", "m": m, "n": n, "k": k, "count": count,
            "median_s": seconds, "ok": ok}


def test_a_models_curve_is_its_bytes_over_the_time_its_matrices_take_together():
    """Two matrices: 10 of 1,000 x 1,000 f32 (4 MB each) at 0.2 ms, one of 100,000 x 1,000 (400 MB) at 20 ms:
    440 MB in 22 ms is 20 GB/s at one row; at four rows the head slows to 42 ms: 440 MB / 44 ms = 10 GB/s
    (not the 15 GB/s mean of the two matrices' rates). A row count where one matrix failed has no point."""
    measured = [_timed("m", 1, 1000, 1000, 10, 2e-4), _timed("m", 1, 100_000, 1000, 1, 0.02),
                _timed("m", 4, 1000, 1000, 10, 2e-4), _timed("m", 4, 100_000, 1000, 1, 0.042),
                _timed("m", 16, 1000, 1000, 10, 2e-4), _timed("m", 16, 100_000, 1000, 1, None, ok=False)]
    curve = model_stream(measured)["m"]["fp32"]
    assert set(curve) == {1, 4}
    assert curve[1] == pytest.approx(20e9) and curve[4] == pytest.approx(10e9)


torch = pytest.importorskip("torch", reason="calibration needs the calibrate extra (torch)")


@pytest.fixture(scope="module")
def profile():
    """A small calibration that also times a two-layer model of Qwen2.5-0.5B's widths (vocabulary cut to 4,096)."""
    from calibrate.run import calibrate, tiny_plan, with_models
    qwen = DB.models.get("qwen2.5-0.5b")
    small = SimpleNamespace(name="small-qwen", shape=qwen.shape.model_copy(update={"num_layers": 2,
                                                                                     "vocab_size": 4096}))
    plan = replace(tiny_plan("cpu"), dtypes=("fp32",), matmul_rows=(1, 4), gemm_sizes=(64,))
    return calibrate("cpu", "quick", plan=with_models(plan, [small, DB.models.get("qwen3-30b-a3b")]))


def test_the_calibration_times_the_models_matrices(profile):
    timed = {(m["n"], m["k"], m["count"], m["m"]) for m in profile.measurements if m["bench"] == "model_matmul"}
    # Q and O are 896 x 896; K and V 128 x 896; gate and up 4,864 x 896; down 896 x 4,864; the head 4,096 x 896
    assert timed == {(n, k, c, m) for n, k, c in ((896, 896, 4), (128, 896, 4), (4864, 896, 4), (896, 4864, 2),
                                                   (4096, 896, 1)) for m in (1, 4)}
    curve = profile.summary.model_weight_stream_bytes_per_s
    assert set(curve) == {"small-qwen"} and set(curve["small-qwen"]["fp32"]) == {1, 4}   # the MoE model adds none
    from calibrate.summary import format_profile
    assert "small-qwen fp32 weight stream (M=4)" in format_profile(profile, None)   # the summary shows it


def test_an_estimate_reads_its_models_own_curve(profile):
    """Qwen2.5-0.5B's weights stream at its own curve's rate where the profile has one; another model keeps
    the calibration shape's."""
    from estimator.evaluation.api import estimate
    fixed = {"read_bandwidth_bytes_per_s": 20e9, "gemm_flops_per_s": {"fp32": 200e9},
             "weight_stream_bytes_per_s": {"fp32": {1: 12e9, 4: 16e9}},
             "model_weight_stream_bytes_per_s": {"Qwen2.5-0.5B": {"fp32": {1: 9e9, 4: 6e9}}}}
    steady = profile.model_copy(update={"summary": profile.summary.model_copy(update=fixed)})
    for model, rate in (("qwen2.5-0.5b", 6e9), ("llama-3.2-1b", 16e9)):
        e = estimate(model, "local", weight_format="f32", calibration=steady, batch=4, prompt_tokens=64,
                     output_tokens=16, engine="transformers")   # PyTorch's own GEMMs: the curve's rate as it is
        # four rows of a 0.5-1B model: about 4-10 GFLOP a step against 0.2 TFLOPS, under the weights' time
        assert e.decode_linear_s == pytest.approx(e.decode_bytes_weights / rate, rel=0.05), model


@pytest.mark.parametrize("argv, message", [
    (["calibrate", "--smoke", "--model", "qwen3-30b-a3b"], "--model qwen3-30b-a3b: Qwen3-30B-A3B is a mixture"),
    (["calibrate", "--model", "no-such-model"], "unknown model 'no-such-model'"),
    (["calibrate", "--compare", "a.yaml", "b.yaml", "--model", "llama-3.1-8b"], "not used by --compare"),
])
def test_calibrate_model_refuses_what_it_cannot_time(argv, message, capsys):
    from estimator.cli import main
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
