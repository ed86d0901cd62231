"""A serving engine's estimate is measured with that engine's own tools, over the run the estimate describes."""

from __future__ import annotations

import shlex

import pytest
import yaml

from estimator.evaluation.api import estimate
from estimator.reporting.verify import verify_commands
from estimator.serving.lengths import RandomDraw, random_draw, scaled_preset

from tests.helpers import command_flags


def _commands(model="llama-3.1-8b", gpu="h100", **kw) -> dict:
    """The commands of an estimate by tool (the last of a tool's kind wins)."""
    return {c["tool"]: c for c in verify_commands(estimate(model, gpu, **kw))}


def test_sglang_static_batch_runs_one_batch_without_a_server():
    c = _commands(engine="sglang", batch=4, prompt_tokens=300, output_tokens=50)
    assert list(c) == ["SGLang", "roofline"]
    flags = command_flags(c["SGLang"]["command"])
    assert c["SGLang"]["command"].startswith("python -m sglang.bench_one_batch --model-path meta-llama/Llama-3.1-8B")
    assert (flags["--batch-size"], flags["--input-len"], flags["--output-len"]) == ("4", "300", "50")


def test_sglang_under_load_serves_its_layout_and_replays_the_run():
    c = _commands("deepseek-v3", "h200", n_gpus=8, engine="sglang", weight_format="fp8", kv_format="fp8",
                  attention_dp=True, ep=8, concurrency=32, num_requests=320, prompt_tokens=1000, output_tokens=100,
                  max_num_seqs=64)
    server, client = command_flags(c["SGLang server"]["command"]), command_flags(c["SGLang bench_serving"]["command"])
    assert (server["--tp-size"], server["--dp-size"], server["--enable-dp-attention"], server["--ep-size"],
            server["--kv-cache-dtype"], server["--max-running-requests"]) == ("8", "8", True, "8", "fp8_e4m3", "64")
    # every request at the set lengths: bench_serving's own default ratio 0 would draw them from 1 to it
    assert (client["--backend"], client["--random-input-len"], client["--random-output-len"],
            client["--random-range-ratio"], client["--max-concurrency"], client["--num-prompts"]) == \
        ("sglang", "1000", "100", "1", "32", "320")


@pytest.mark.parametrize("clients, prompts", [(16, 1000), (50, 1000), (100, 2000)])
def test_an_endless_closed_loop_is_measured_over_enough_requests_for_a_small_first_wave(clients, prompts):
    client = command_flags(_commands(concurrency=clients)["vLLM bench serve"]["command"])
    assert client["--max-concurrency"] == str(clients) and int(client["--num-prompts"]) == prompts
    assert clients / prompts <= 0.05


def test_a_burst_is_every_prompt_at_once_and_a_rate_keeps_the_default_run():
    burst = command_flags(_commands(num_requests=500)["vLLM bench serve"]["command"])
    assert burst["--num-prompts"] == "500" and "--request-rate" not in burst and "--max-concurrency" not in burst
    rated = command_flags(_commands(rate=2.5)["vLLM bench serve"]["command"])
    assert rated["--request-rate"] == "2.5" and "--num-prompts" not in rated


def test_vllm_server_takes_the_running_limit_chunk_budget_and_expert_parallelism():
    c = _commands("qwen3-30b-a3b", "h100", n_gpus=2, ep=2, concurrency=8, max_num_seqs=128, chunked_prefill=2048)
    server = command_flags(c["vLLM server"]["command"])
    assert (server["--tensor-parallel-size"], server["--enable-expert-parallel"], server["--max-num-seqs"],
            server["--max-num-batched-tokens"]) == ("2", True, "128", "2048")


def test_tensorrt_llm_benches_a_burst_over_a_dataset_of_fixed_lengths():
    c = _commands("llama-3.1-70b", engine="TensorRT-LLM", weight_format="fp8", kv_format="fp8", n_gpus=2,
                  num_requests=3000, prompt_tokens=128, output_tokens=2048)
    assert list(c) == ["TensorRT-LLM options", "TensorRT-LLM dataset", "TensorRT-LLM", "roofline"]
    data = command_flags(c["TensorRT-LLM dataset"]["command"])
    assert (data["--num-requests"], data["--input-mean"], data["--input-stdev"], data["--output-mean"],
            data["--output-stdev"]) == ("3000", "128", "0", "2048", "0")
    bench = command_flags(c["TensorRT-LLM"]["command"])
    assert bench["--dataset"] == "dataset.jsonl" and bench["--tp"] == "2" and "--concurrency" not in bench
    assert bench["--extra_llm_api_options"] == "llm-api-options.yml"
    assert c["TensorRT-LLM"]["note"] == "weights in fp8: use a checkpoint of Llama-3.1-70B already quantized to fp8"


def test_tensorrt_llm_options_are_a_yaml_file_written_by_one_shell_line():
    c = _commands("deepseek-v3", "h200", n_gpus=8, engine="TensorRT-LLM", kv_format="fp8", attention_dp=True, ep=8,
                  concurrency=16, chunked_prefill=4096)
    words = shlex.split(c["TensorRT-LLM options"]["command"])
    assert words[0] == "printf" and words[2:] == [">", "llm-api-options.yml"]
    written = yaml.safe_load(words[1].replace("\\n", "\n"))   # printf turns each \n into a line break
    assert written == {"enable_attention_dp": True, "kv_cache_config": {"dtype": "fp8"},
                       "enable_chunked_prefill": True}
    bench = command_flags(c["TensorRT-LLM"]["command"])
    assert (bench["--concurrency"], bench["--tp"], bench["--ep"], bench["--max_num_tokens"]) == \
        ("16", "8", "8", "4096")
    assert "TensorRT-LLM options" not in _commands(engine="TensorRT-LLM", concurrency=4)


def test_tensorrt_llm_static_batch_and_rate():
    static = _commands(engine="TensorRT-LLM", batch=4)
    assert command_flags(static["TensorRT-LLM dataset"]["command"])["--num-requests"] == "4"
    assert command_flags(static["TensorRT-LLM"]["command"])["--concurrency"] == "4"
    rated = _commands(engine="TensorRT-LLM", n_gpus=4, rate=3.0, max_num_seqs=256)
    server = command_flags(rated["TensorRT-LLM server"]["command"])
    assert rated["TensorRT-LLM server"]["command"].startswith("trtllm-serve meta-llama/Llama-3.1-8B")
    assert (server["--tp_size"], server["--max_batch_size"]) == ("4", "256")
    assert command_flags(rated["vLLM bench serve"]["command"])["--request-rate"] == "3"


@pytest.mark.parametrize("value, draw", [
    ("random", RandomDraw(0.0, 1024, 1024)),
    ("random-r0.8@921.5/921.5", RandomDraw(0.8, 1024, 1024)),   # InferenceX's runs: 1,024 at ratio 0.8
    ("random@3981/530", RandomDraw(0.0, 7954, 1060)),
    ("sharegpt", None), ("chat@100/100", None), (None, None)])
def test_the_random_presets_map_to_the_clients_settings(value, draw):
    assert random_draw(value) == draw


@pytest.mark.parametrize("value", ["random@610.1/421", "random-r0.5@700/300", "random-r0.8@921.5/921.5"])
def test_the_replayed_draw_has_the_estimates_means(value):
    """bench_serving draws prompts from max(int(R L), 1) to L and outputs from int(R O) to O: their means are the
    mix's within a token."""
    d, mix = random_draw(value), scaled_preset(*value.split("@")[:1], *map(float, value.split("@")[1].split("/")))
    assert (max(int(d.range_ratio * d.input_len), 1) + d.input_len) / 2 == pytest.approx(mix.mean_prompt_tokens, abs=1)
    assert (int(d.range_ratio * d.output_len) + d.output_len) / 2 == pytest.approx(mix.mean_output_tokens, abs=1)


def test_a_random_mix_is_replayed_by_bench_serving_whichever_engine_serves():
    vllm = _commands(concurrency=8, lengths="random@610/421")
    client = command_flags(vllm["SGLang bench_serving"]["command"])
    assert (client["--backend"], client["--random-range-ratio"], client["--random-input-len"]) == ("vllm", "0", "1219")
    trt = command_flags(_commands(engine="TensorRT-LLM", concurrency=8, lengths="random-r0.8@921.5/921.5")
                 ["TensorRT-LLM dataset"]["command"])
    assert (trt["--input-min"], trt["--input-max"], trt["--output-min"], trt["--output-max"]) == \
        ("819", "1024", "819", "1024")
    # any other mix is measured at its mean lengths
    chat = command_flags(_commands(concurrency=8, lengths="chat")["vLLM bench serve"]["command"])
    assert chat["--random-input-len"] == str(round(estimate("llama-3.1-8b", "h100", concurrency=8,
                                                            lengths="chat").prompt_tokens))


def test_what_the_commands_cannot_set_is_noted():
    online = _commands(engine="sglang", weight_format="fp8", kv_format="fp8", batch=2)["SGLang"]
    assert "note" not in online and command_flags(online["command"])["--quantization"] == "fp8"
    ahead = _commands("mixtral-8x7b", "h200", n_gpus=8, engine="sglang", weight_format="nvfp4", kv_format="int8",
                      batch=4)["SGLang"]
    assert ahead["note"] == ("weights in nvfp4: use a checkpoint of Mixtral-8x7B already quantized to nvfp4; "
                             "KV cache in int8: not set here, the engine keeps its own unless its checkpoint gives one")
    assert "--quantization" not in command_flags(ahead["command"])
