"""Host time of a pass (estimator/physics/host_time.py): per layer, per routed expert, overlapped or not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from estimator.efficiency.calibration_profile import load_profile
from estimator.efficiency.defaults import CLASS_ORDER, GENERIC_ENGINE
from estimator.evaluation.api import estimate
from estimator.physics.host_time import host_costs, overlaps_device, pass_host_time
from estimator.physics.roofline import pass_time

H200_PROFILE = Path(__file__).parents[1] / "hardware_db/calibrations/nvidia-h200-sxm-141gb-vm.yaml"
DENSE = {"layers": 32.0, "moe_layers": 0.0, "experts": 0.0, "experts_per_token": 0.0}
MOE = {"layers": 48.0, "moe_layers": 48.0, "experts": 128.0, "experts_per_token": 8.0}


def test_per_layer_host_time_overlaps_an_accelerator_and_adds_on_a_cpu():
    """Hand-worked: 32 layers x 0.5 ms of host time against 4 ms of weight streaming."""
    queued, fixed = pass_host_time(5e-4, 0.0, DENSE, 1.0, 1, 1, 0.0, 0.0, overlapped=True)
    assert queued == pytest.approx(16e-3) and fixed == 0
    flops = {"linear": 0.0, "head": 0.0, "attention": 0.0}
    bytes_ = {"weights": 4e9, "activations": 0.0, "kv_expand": 0.0, "elementwise": 0.0, "score_ops": 0.0}
    rates = {"linear_flops_per_s": 1e15, "attention_flops_per_s": 1e15, "weight_bytes_per_s": 1e12,
             "kv_bytes_per_s": 1e12, "kv_expand_bytes_per_s": 1e12, "stream_bytes_per_s": 1e12}
    on_gpu = pass_time(flops, bytes_, rates, 1.0, fixed, overlapped_host_s=queued)
    assert on_gpu["time_s"] == pytest.approx(16e-3) and on_gpu["overhead_s"] == pytest.approx(12e-3)
    queued, fixed = pass_host_time(5e-4, 0.0, DENSE, 1.0, 1, 1, 0.0, 0.0, overlapped=False)
    on_cpu = pass_time(flops, bytes_, rates, 1.0, fixed, overlapped_host_s=queued)
    assert on_cpu["time_s"] == pytest.approx(20e-3)


def test_each_routed_expert_an_eager_loop_runs_costs_host_time_that_never_overlaps():
    """One token routes to 8 distinct experts in each of 48 layers: 384 expert loops of 0.3 ms."""
    queued, fixed = pass_host_time(0.0, 3e-4, MOE, 1.0, 1, 1, 0.0, 0.0, overlapped=True)
    assert queued == 0 and fixed == pytest.approx(48 * 8 * 3e-4)
    _, halved = pass_host_time(0.0, 3e-4, MOE, 1.0, 1, 2, 0.0, 0.0, overlapped=True)   # two EP ranks in parallel
    assert halved == pytest.approx(fixed / 2)
    _, on_host = pass_host_time(0.0, 3e-4, MOE, 1.0, 1, 1, 48.0, 0.0, overlapped=True)  # experts on the CPU
    assert on_host == 0


def test_only_the_reference_decoder_takes_the_calibrations_host_times():
    """The calibration times calibrate/decoder.py's host loop: that decoder's engine takes it; another eager engine
    (transformers' generate(), more host code per step) keeps its own fitted cost."""
    hw = {"eager_layer_s": np.array([6e-4, np.nan]), "eager_expert_s": np.array([3e-4, np.nan]),
          "device_class_code": np.array([CLASS_ORDER.index("datacenter_gpu"), CLASS_ORDER.index("cpu")])}
    eager = GENERIC_ENGINE.model_copy(update={"eager_host": True, "per_layer_s": 5e-4, "per_expert_s": 1e-4})
    reference = eager.model_copy(update={"reference_decoder": True})
    layer, expert = host_costs(reference, hw)
    assert list(layer) == [6e-4, 5e-4] and list(expert) == [3e-4, 1e-4]     # measured where calibrated
    layer, expert = host_costs(eager, hw)
    assert np.all(layer == 5e-4) and np.all(expert == 1e-4)
    assert list(overlaps_device(eager, hw)) == [True, False]
    layer, expert = host_costs(GENERIC_ENGINE, hw)
    assert layer == GENERIC_ENGINE.per_layer_s and expert == 0
    assert not np.any(overlaps_device(GENERIC_ENGINE, hw))


def test_a_calibrated_h200_runs_eager_decode_at_its_measured_host_cost():
    """Llama-3.1-8B bf16 at batch 1 on the H200 profile: the eager decoder is host-bound (32 x 0.34 ms of launches
    against ~4.3 ms of weights), vLLM is not; doubling the measured host cost doubles the eager step."""
    profile = load_profile(H200_PROFILE)
    args = {"weight_format": "bf16", "batch": 1, "prompt_tokens": 512, "output_tokens": 16, "calibration": profile}
    eager = estimate("llama-3.1-8b", "h200", engine="pytorch-eager", **args)
    step = 1 / eager.decode_tps_per_seq
    assert step == pytest.approx(32 * profile.summary.eager_layer_s, rel=0.1)
    slower = profile.model_copy(update={"summary": profile.summary.model_copy(
        update={"eager_layer_s": 2 * profile.summary.eager_layer_s})})
    doubled = estimate("llama-3.1-8b", "h200", engine="pytorch-eager", **{**args, "calibration": slower})
    assert 1 / doubled.decode_tps_per_seq == pytest.approx(2 * step, rel=0.1)
    served = estimate("llama-3.1-8b", "h200", engine="vllm", **args)
    assert served.decode_tps_per_seq > 1.5 * eager.decode_tps_per_seq
    assert estimate("llama-3.1-8b", "h200", engine="vllm", **{**args, "calibration": slower}).decode_tps_per_seq \
        == pytest.approx(served.decode_tps_per_seq)
