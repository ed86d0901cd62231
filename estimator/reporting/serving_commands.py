"""The commands that measure a serving engine's estimate with that engine's own tools.

Pure functions of :func:`estimator.reporting.verify.inputs_of`'s inputs; the sources are in docs/formulas.md §14,
"Measuring an estimate":

- vLLM (and the generic engine): ``vllm bench latency`` for a static batch; ``vllm serve`` and ``vllm bench serve``
  for a run of requests.
- SGLang: ``python -m sglang.bench_one_batch`` for a static batch (one batch through the model runner, no server);
  ``python -m sglang.launch_server`` and ``python -m sglang.bench_serving`` for a run.
- TensorRT-LLM: ``trtllm-bench throughput`` over a dataset that the repository's
  ``benchmarks/cpp/prepare_dataset.py`` writes, for a static batch (that many requests, all in flight), a burst and
  a closed loop (``--concurrency``); ``trtllm-serve`` and ``vllm bench serve`` at a request rate, which
  trtllm-bench does not pace. Attention data parallelism, an FP8 KV cache and chunked prefill are LLM API options:
  a YAML file written first and passed with ``--extra_llm_api_options``.

The run is the estimate's: a burst of N requests (``--num-requests`` alone) is N prompts at an unbounded rate; C
clients (``--concurrency``) are ``--max-concurrency C`` over N prompts, or for an endless loop over
max(1000, 20 C), so that the first C, sent at once, are at most 5% of them; a rate is ``--request-rate``. Every
request has the estimate's lengths (vllm bench serve's random dataset at its default range ratio 0; bench_serving's
at ``--random-range-ratio 1``, since its own default 0 draws each length from 1 to the set one), except that
SGLang's random draw (``--lengths random``, ``random-rR``) is replayed as bench_serving draws it, or as
prepare_dataset.py's uniform draw for trtllm-bench; any other mix is measured at its mean lengths.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from estimator.serving.lengths import RandomDraw, random_draw

# vllm bench serve's and bench_serving's default --num-prompts
CLIENT_PROMPTS = 1000
# requests a client sends in the run that measures an endless closed loop: the first wave is 1/20 of them
STEADY_REQUESTS_PER_CLIENT = 20
TRTLLM_DATASET = "dataset.jsonl"
TRTLLM_OPTIONS = "llm-api-options.yml"


def shell_word(text) -> str:
    """``text`` as one shell word, quoted where it needs to be."""
    return shlex.quote(str(text))


def model_arg(i: dict) -> str:
    """The model as the tools load it: its Hugging Face id, else its name."""
    return shell_word(i["hf_id"] or i["model"])


def _fp8_weights(i: dict) -> bool:
    return str(i["weight_format"]).lower() == "fp8"


def _fp8_cache(i: dict) -> bool:
    return str(i["kv_format"]).lower().startswith("fp8")


def _format_note(i: dict, online_fp8: bool) -> dict:
    """What the commands cannot set: weights the engine loads only from a checkpoint quantized ahead of time (every
    format but 16- and 32-bit ones, and FP8 too where ``online_fp8`` is False: the engine cannot quantize a 16-bit
    checkpoint to FP8 itself), and a cache format it has no flag for."""
    notes = []
    weights = str(i["weight_format"])
    if weights.lower() not in ("f32", "f16", "bf16") and not (online_fp8 and _fp8_weights(i)):
        notes.append(f"weights in {weights}: use a checkpoint of {i['model']} already quantized to {weights}")
    if str(i["kv_format"]).lower() not in ("f16", "bf16") and not _fp8_cache(i):
        notes.append(f"KV cache in {i['kv_format']}: not set here, the engine keeps its own unless its checkpoint "
                     "gives one")
    return {"note": "; ".join(notes)} if notes else {}


def run_prompts(i: dict) -> int | None:
    """Prompts in the run: the estimate's N; for an endless closed loop enough that its first wave is at most 5%;
    None (the client's default) for a rate, whose steady state the first requests barely move."""
    if i["num_requests"]:
        return i["num_requests"]
    if i["concurrency"]:
        return max(CLIENT_PROMPTS, STEADY_REQUESTS_PER_CLIENT * i["concurrency"])
    return None


def _load_flags(i: dict) -> str:
    """The client's pacing: clients, a rate, or (a burst) neither, every prompt sent at once; then the prompts."""
    load = (f" --max-concurrency {i['concurrency']}" if i["concurrency"]
            else f" --request-rate {i['rate']:g}" if i["rate"] else "")
    prompts = run_prompts(i)
    return load + (f" --num-prompts {prompts}" if prompts else "")


def _bench_serving(i: dict, backend: str, draw: RandomDraw | None) -> dict:
    """SGLang's client: its random dataset at fixed lengths, or at the draw the estimate's mix describes. Its sglang
    backend talks to launch_server's port (30000), its vllm backend to an OpenAI-compatible server on 8000."""
    lengths = (f"--random-input-len {draw.input_len} --random-output-len {draw.output_len} "
               f"--random-range-ratio {draw.range_ratio:g}" if draw else
               f"--random-input-len {i['prompt_tokens']} --random-output-len {i['output_tokens']} "
               "--random-range-ratio 1")
    return {"tool": "SGLang bench_serving", "command":
            f"python -m sglang.bench_serving --backend {backend} --model {model_arg(i)} --dataset-name random "
            f"{lengths}{_load_flags(i)}"}


def _client(i: dict, draw: RandomDraw | None) -> dict:
    """vllm bench serve against an OpenAI-compatible server on port 8000; bench_serving where the mix is its draw."""
    if draw:
        return _bench_serving(i, "vllm", draw)
    return {"tool": "vLLM bench serve", "command":
            f"vllm bench serve --model {model_arg(i)} --dataset-name random --random-input-len {i['prompt_tokens']} "
            f"--random-output-len {i['output_tokens']}{_load_flags(i)} --ignore-eos"}


def _under_load(i: dict) -> bool:
    return bool(i["concurrency"] or i["rate"] or i["num_requests"])


# The settings vLLM and SGLang both take as flags, each in its own spelling: pipeline stages, online FP8 of a 16-bit
# checkpoint, an FP8 KV cache, the running limit and the chunked-prefill budget.
VLLM_FLAGS = {"pp": "--pipeline-parallel-size", "fp8_weights": "--quantization fp8",
              "fp8_cache": "--kv-cache-dtype fp8", "max_num_seqs": "--max-num-seqs",
              "chunked_prefill": "--max-num-batched-tokens"}
SGLANG_FLAGS = {"pp": "--pp-size", "fp8_weights": "--quantization fp8", "fp8_cache": "--kv-cache-dtype fp8_e4m3",
                "max_num_seqs": "--max-running-requests", "chunked_prefill": "--chunked-prefill-size"}


def _shared_flags(i: dict, flags: dict) -> str:
    args = f" {flags['pp']} {i['pp']}" if i["pp"] > 1 else ""
    if _fp8_weights(i):
        args += f" {flags['fp8_weights']}"
    if _fp8_cache(i):
        args += f" {flags['fp8_cache']}"
    return args + "".join(f" {flags[k]} {i[k]}" for k in ("max_num_seqs", "chunked_prefill") if i[k])


def _vllm_args(i: dict) -> str:
    args = ""
    if i["attention_dp"] and i["tp"] > 1:   # vLLM's attention data parallelism: DP ranks share the MoE layers
        args += f" --data-parallel-size {i['tp']}"
    elif i["tp"] > 1:
        args += f" --tensor-parallel-size {i['tp']}"
    if i["ep"] > 1:     # the MoE layers' experts split over the TP x DP ranks instead of each expert's matrices
        args += " --enable-expert-parallel"
    return args + _shared_flags(i, VLLM_FLAGS)


def _batch_or_run(i: dict, name: str, static: str, server: str, client: Callable[[], dict]) -> list[dict]:
    """A static batch's one command, or a run's server and client (built only for a run); what the flags cannot set
    is noted on the engine's own command (vLLM and SGLang quantize a 16-bit checkpoint to FP8 themselves)."""
    note = _format_note(i, online_fp8=True)
    if not _under_load(i):
        return [{"tool": name, "command": static, **note}]
    return [{"tool": f"{name} server", "command": server, **note}, client()]


def vllm(i: dict) -> list[dict]:
    model, args = model_arg(i), _vllm_args(i)
    return _batch_or_run(i, "vLLM", f"vllm bench latency --model {model} --input-len {i['prompt_tokens']} "
                                    f"--output-len {i['output_tokens']} --batch-size {i['batch']}{args}",
                         f"vllm serve {model}{args}", lambda: _client(i, random_draw(i["lengths"])))


def _sglang_args(i: dict) -> str:
    args = ""
    if i["tp"] > 1:
        args += f" --tp-size {i['tp']}"
        if i["attention_dp"]:   # DP attention: as many attention replicas as TP ranks, the MoE layers shared
            args += f" --dp-size {i['tp']} --enable-dp-attention"
    if i["ep"] > 1:
        args += f" --ep-size {i['ep']}"
    return args + _shared_flags(i, SGLANG_FLAGS)


def sglang(i: dict) -> list[dict]:
    model, args = model_arg(i), _sglang_args(i)
    return _batch_or_run(i, "SGLang", f"python -m sglang.bench_one_batch --model-path {model} "
                                      f"--batch-size {i['batch']} --input-len {i['prompt_tokens']} "
                                      f"--output-len {i['output_tokens']}{args}",
                         f"python -m sglang.launch_server --model-path {model}{args}",
                         lambda: _bench_serving(i, "sglang", random_draw(i["lengths"])))


def _trtllm_options(i: dict) -> dict | None:
    """The LLM API options the estimate needs, written to a YAML file, or None where the defaults are the estimate's."""
    lines = []
    if i["attention_dp"] and i["tp"] > 1:
        lines.append("enable_attention_dp: true")
    if _fp8_cache(i):
        lines += ["kv_cache_config:", "  dtype: fp8"]
    if i["chunked_prefill"]:
        lines.append("enable_chunked_prefill: true")
    if not lines:
        return None
    text = "".join(line + "\\n" for line in lines)   # one shell line: printf writes each \\n as a line break
    return {"tool": "TensorRT-LLM options", "command": f"printf {shell_word(text)} > {TRTLLM_OPTIONS}"}


def _trtllm_args(i: dict, flag, options: dict | None) -> str:
    """trtllm-serve's (``--tp_size``) or trtllm-bench's (``--tp``) parallel flags, the scheduler's limits and the
    options file."""
    args = "".join(f" {flag(name)} {i[name]}" for name in ("tp", "pp", "ep") if i[name] > 1)
    if i["max_num_seqs"]:
        args += f" --max_batch_size {i['max_num_seqs']}"
    if i["chunked_prefill"]:
        args += f" --max_num_tokens {i['chunked_prefill']}"
    return args + (f" --extra_llm_api_options {TRTLLM_OPTIONS}" if options else "")


def _trtllm_dataset(i: dict, requests: int, draw: RandomDraw | None) -> dict:
    """prepare_dataset.py's requests: fixed lengths (a normal of zero spread), or the uniform draw of SGLang's random
    dataset, from max(int(R L), 1) to L (outputs of at least one token)."""
    if draw:
        low_in, low_out = (max(int(draw.range_ratio * n), 1) for n in (draw.input_len, draw.output_len))
        lengths = (f"token-unif-dist --num-requests {requests} --input-min {low_in} --input-max {draw.input_len} "
                   f"--output-min {low_out} --output-max {draw.output_len}")
    else:
        lengths = (f"token-norm-dist --num-requests {requests} --input-mean {i['prompt_tokens']} --input-stdev 0 "
                   f"--output-mean {i['output_tokens']} --output-stdev 0")
    return {"tool": "TensorRT-LLM dataset", "command":
            f"python benchmarks/cpp/prepare_dataset.py --stdout --tokenizer {model_arg(i)} {lengths} "
            f"> {TRTLLM_DATASET}",
            "note": "from a checkout of the TensorRT-LLM repository"}


def tensorrt_llm(i: dict) -> list[dict]:
    model, options, draw = model_arg(i), _trtllm_options(i), random_draw(i["lengths"])
    # TensorRT-LLM takes FP8 weights from a checkpoint quantized ahead of time (NVIDIA's ModelOpt ones)
    checkpoint = _format_note(i, online_fp8=False)
    out = [options] if options else []
    if i["rate"]:
        return out + [{"tool": "TensorRT-LLM server",
                       "command": f"trtllm-serve {model}{_trtllm_args(i, lambda n: f'--{n}_size', options)}",
                       **checkpoint}, _client(i, draw)]
    # trtllm-bench: a static batch is that many requests all in flight; a burst has no limit on requests in flight
    requests = run_prompts(i) or i["batch"]
    in_flight = i["concurrency"] or (0 if i["num_requests"] else i["batch"])
    bench = (f"trtllm-bench --model {model} throughput --dataset {TRTLLM_DATASET}"
             f"{f' --concurrency {in_flight}' if in_flight else ''} --streaming"
             f"{_trtllm_args(i, lambda n: f'--{n}', options)}")
    return out + [_trtllm_dataset(i, requests, draw), {"tool": "TensorRT-LLM", "command": bench, **checkpoint}]


SERVING_TOOLS = {"vllm": vllm, "sglang": sglang, "tensorrt-llm": tensorrt_llm, "generic": vllm}
