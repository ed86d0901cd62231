"""Host time of a forward pass: the engine's cost per layer, and per routed expert for a loop over experts.

An engine that launches its ops one at a time from Python (eager PyTorch, as Hugging Face transformers
runs) pays the host's time for every op whatever the device does; for a mixture of experts it also loops
over the experts a layer's tokens chose, and waits on the device for each one's rows. On a device with a
calibration, the profile's measurement of both (the reference decoder at tiny shapes, calibrate/decoder.py)
replaces that decoder's figures (the pytorch-eager profile; docs/formulas.md §13).
"""

from __future__ import annotations

import numpy as np

from estimator.efficiency.defaults import CLASS_ORDER, EngineDefaults
from estimator.physics.expert_skew import distinct_experts


def overlaps_device(engine: EngineDefaults, hw: dict):
    """Whether an engine's per-layer host time runs beside the device's work: an eager engine on an accelerator
    (on a CPU the host is the device)."""
    return engine.eager_host & (hw["device_class_code"] != CLASS_ORDER.index("cpu"))


def host_costs(engine: EngineDefaults, hw: dict) -> tuple[np.ndarray, np.ndarray]:
    """Host seconds per layer and per routed expert run: a calibration's measurement on a calibrated device (``hw``
    columns ``eager_layer_s``, ``eager_expert_s``, NaN elsewhere) for the decoder it timed (``reference_decoder``),
    else the engine's. Another eager engine keeps its fitted cost: transformers' generate() runs more host code
    per layer and step than the reference decoder (docs/formulas.md §13)."""
    layer, expert = np.asarray(engine.per_layer_s, dtype=float), np.asarray(engine.per_expert_s, dtype=float)
    if not engine.reference_decoder or "eager_layer_s" not in hw:
        return layer, expert
    measured_layer, measured_expert = hw["eager_layer_s"], hw["eager_expert_s"]
    return (np.where(np.isfinite(measured_layer), measured_layer, layer),
            np.where(np.isfinite(measured_expert), measured_expert, expert))


def pass_host_time(layer_s, expert_s, m: dict, tokens, pp, ep, cpu_layers, skew, overlapped):
    """Host time of one pipeline-stage pass of ``tokens`` tokens: (the part that overlaps the device's work,
    the part that does not).

    L/pp · t_layer, plus L_moe/pp · E_touched/ep · t_expert, where E_touched is the expected number of distinct
    experts the tokens route to (docs/formulas.md §4); each expert-parallel rank loops over its own share, and
    experts run on the host CPU (llama.cpp --n-cpu-moe) are not in the device's loop. Where ``overlapped``
    (an eager engine on an accelerator: ops are queued asynchronously) the per-layer part runs while the device
    works; the per-expert part never does, since each expert's rows are read back before its kernels launch."""
    layers = m["layers"] / pp * layer_s
    experts = 0.0
    if np.any(np.asarray(expert_s) > 0):
        touched = distinct_experts(m["experts"], m["experts_per_token"], tokens, skew)
        experts = np.maximum(m["moe_layers"] - cpu_layers, 0.0) / pp * touched / np.maximum(ep, 1) * expert_s
    return np.where(overlapped, layers, 0.0), np.where(overlapped, 0.0, layers) + experts


def eager_prefill_time(engine: EngineDefaults, m: dict, tokens, pp):
    """Host time of one pipeline-stage prefill pass of ``tokens`` tokens that the engine launches from Python, 0 where
    it replays the pass from captured CUDA graphs.

    Serving engines capture graphs for decode steps (and vLLM V1 for steps of up to 512 tokens, piecewise), so a
    prompt pass beyond ``graphed_prefill_tokens`` launches every kernel from Python: L_dense · t_dense + L_moe ·
    t_moe per stage, host time that runs beside the device's work (the pass lasts the longer of the two). SGLang
    measured a DeepSeek-V3 prefill of one new token at 82.6 ms launched so and 23.1 ms replayed from graphs
    (docs/formulas.md §14)."""
    if engine.graphed_prefill_tokens is None or not engine.eager_prefill_layer_s:
        return 0.0
    moe_layers = np.asarray(m["moe_layers"], dtype=float)
    per_stage = ((np.asarray(m["layers"], dtype=float) - moe_layers) * engine.eager_prefill_layer_s.get("dense", 0.0)
                 + moe_layers * engine.eager_prefill_layer_s.get("moe", 0.0)) / np.asarray(pp, dtype=float)
    return np.where(np.asarray(tokens, dtype=float) > engine.graphed_prefill_tokens, per_stage, 0.0)
