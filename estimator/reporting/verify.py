"""The commands that measure what an estimate predicts, on the user's own machine.

Pure functions of the estimate's inputs (:meth:`Estimate.to_dict` plus the device's vendor and
class): no file is read and nothing is run. The tool follows the engine and the device:

- llama.cpp (engine llama.cpp, or a GGUF weight format such as Q4_K_M): ``llama-bench`` (llama.cpp's
  README for the tool: ``-p`` prompt tokens, ``-n`` generated tokens, ``-b`` logical batch size,
  i.e. prompt tokens per step, default 2048, ``-ngl`` layers on the GPU, ``-fa`` flash attention).
  It times one sequence; for a batch above 1, ``llama-batched-bench`` (``-npp`` prompt tokens,
  ``-ntg`` generated tokens, ``-npl`` parallel sequences, ``-c`` context) as well.
- vLLM, SGLang and TensorRT-LLM (and the generic engine, as vLLM) on an NVIDIA or AMD device: the
  engine's own benchmark tools, for a static batch and for a run of requests under the estimate's
  load (:mod:`estimator.reporting.serving_commands`).
- MLX (Apple devices): ``mlx_lm.benchmark`` (mlx-lm's benchmark.py: ``--model``, ``-p`` prompt
  tokens, ``-g`` generation tokens, ``-b`` batch size).
- Always: ``roofline validate --local``, which times a random-weight model in torch here.

A request mix (``--lengths``) is measured at its mean lengths, except a benchmark client's own random
draw, which the serving commands replay.
"""

from __future__ import annotations

import re

from estimator.evaluation.api import Estimate
from estimator.physics.offload import DEFAULT_UBATCH_TOKENS
from estimator.reporting.serving_commands import SERVING_TOOLS, model_arg, shell_word

GPU_VENDORS = ("NVIDIA", "AMD")
LLAMA_BENCH_BATCH = 2048   # llama-bench's default logical batch (-b)


def inputs_of(e: Estimate) -> dict:
    """The inputs the commands depend on: the estimate's, and its device's vendor and class."""
    d = e.to_dict()
    return {**{k: d[k] for k in ("model", "hf_id", "hardware", "n_gpus", "tp", "pp", "ep", "attention_dp",
                                 "engine", "weight_format",
                                 "kv_format", "batch", "prompt_tokens", "output_tokens", "concurrency", "rate",
                                 "num_requests", "max_num_seqs", "lengths", "attention", "gpu_layers",
                                 "chunked_prefill", "ubatch_tokens")},
            # a length mix is measured at its mean lengths (whole tokens): the tools take one length
            "prompt_tokens": round(d["prompt_tokens"]), "output_tokens": round(d["output_tokens"]),
            "vendor": e.hardware.vendor, "device_class": e.hardware.device_class.value,
            "gguf": e.weight_format.dequant == "gguf", "num_layers": e.model.shape.num_layers,
            "moe": e.model.shape.moe is not None}


def tool_for(i: dict) -> str | None:
    """llama.cpp, mlx, a serving engine's tools (vllm, sglang, tensorrt-llm; generic: vLLM's), or None when none of
    them fits the engine and device."""
    engine = str(i["engine"]).split("@")[0].lower()
    if i.get("gguf") or engine == "llama.cpp":
        return "llama.cpp"
    if i["vendor"] == "Apple" or engine == "mlx":
        return "mlx"
    if engine in SERVING_TOOLS and i["vendor"] in GPU_VENDORS and i["device_class"] != "cpu":
        return engine
    return None


def llama_cpp(i: dict) -> list[dict]:
    ngl = 0 if i["device_class"] == "cpu" else (i["gpu_layers"] if i["gpu_layers"] is not None else 99)
    model = shell_word(f"{i['model']}-{i['weight_format']}.gguf")
    logical_batch = i["chunked_prefill"] or LLAMA_BENCH_BATCH
    # the physical micro-batch, when it is not llama.cpp's default
    micro = f" -ub {i['ubatch_tokens']}" if i["ubatch_tokens"] != DEFAULT_UBATCH_TOKENS else ""
    out = [{"tool": "llama-bench", "command":
            f"llama-bench -m {model} -p {i['prompt_tokens']} -n {i['output_tokens']} -b {logical_batch}{micro}"
            f" -ngl {ngl} -fa {1 if i['attention'] == 'fused' else 0}"}]
    sequences = i["concurrency"] or i["batch"]
    if sequences > 1 or i["rate"]:
        # llama-bench decodes one sequence; batched-bench decodes -npl of them together. Its -fa flag
        # changed form across builds (a switch, then on/off/auto), so it is left to the build's default.
        context = sequences * (i["prompt_tokens"] + i["output_tokens"])
        batched = {"tool": "llama-batched-bench", "command":
                   f"llama-batched-bench -m {model} -c {context} -b {logical_batch}{micro} -npp {i['prompt_tokens']} "
                   f"-ntg {i['output_tokens']} -npl {sequences} -ngl {ngl}"}
        if i.get("moe"):   # builds before August 2025 fed every sequence token 0: a MoE batch routed as one sequence
            batched["note"] = ("use a build from August 2025 on: older ones feed every sequence the same tokens, which "
                               "a MoE model routes to the same experts; docs/formulas.md §9")
        out.append(batched)
    return out


def mlx(i: dict) -> list[dict]:
    model = model_arg(i)
    out = []
    bits = re.match(r"mlx-q(\d)", str(i["weight_format"]).lower())
    if bits:
        # mlx_lm.benchmark loads the checkpoint as stored: quantize a copy first (mlx_lm.convert's
        # default group size; the format's own group size is not in its resolved name)
        path = shell_word(f"{i['model']}-{i['weight_format']}")
        out.append({"tool": "mlx-lm convert", "command":
                    f"mlx_lm.convert --hf-path {model} --mlx-path {path} -q --q-bits {bits.group(1)}"})
        model = path
    out.append({"tool": "MLX", "command": f"mlx_lm.benchmark --model {model} -p {i['prompt_tokens']} "
                                          f"-g {i['output_tokens']} -b {i['concurrency'] or i['batch']}"})
    return out


def roofline_local(i: dict) -> dict:
    device = ("mps" if i["vendor"] == "Apple" else "cuda" if i["vendor"] in GPU_VENDORS and
              i["device_class"] != "cpu" else "cpu")
    output = f" --output {i['output_tokens']}" if i["output_tokens"] >= 2 else ""
    return {"tool": "roofline", "command":
            f"roofline validate --local --device {device} --model {model_arg(i)} "
            f"--batch {i['concurrency'] or i['batch']} --prompt {i['prompt_tokens']}{output}"}


def commands_for(i: dict) -> list[dict]:
    """{tool, command} for each command that measures these inputs, the engine's tool first."""
    tool = tool_for(i)
    engine = {"llama.cpp": llama_cpp, "mlx": mlx, **SERVING_TOOLS}[tool](i) if tool else []
    return engine + [roofline_local(i)]


def verify_commands(e: Estimate) -> list[dict]:
    return commands_for(inputs_of(e))


def format_verify(commands: list[dict]) -> str:
    lines = ["Verify it yourself (measures the same configuration on this machine)"]
    for c in commands:
        lines.append(f"  {c['tool']}: {c['command']}")
        if "note" in c:
            lines.append(f"    ({c['note']})")
    return "\n".join(lines)

