"""Published measurements beside an estimate, and the commands that measure it on the user's machine."""

from __future__ import annotations

import json
import shlex

import pytest

from estimator.cli import main
from estimator.evaluation.api import estimate
from estimator.reporting.measured import LIMIT, format_measured, measured_rows
from estimator.reporting.verify import commands_for, format_verify, inputs_of, verify_commands

from tests.helpers import command_flags

LLAMA3 = "meta-llama/Meta-Llama-3-8B"
RTX4090 = "NVIDIA GeForce RTX 4090"


def _llama_cpp(**kw):
    args = {"weight_format": "Q4_K_M", "engine": "llama.cpp", "batch": 1, "prompt_tokens": 512,
            "output_tokens": 128, "attention": "unfused"}
    return estimate(LLAMA3, RTX4090, **{**args, **kw})


def _by_id(rows):
    return {r["id"]: r for r in rows}


def test_measured_rows_have_a_ratio_only_where_the_settings_match():
    e = _llama_cpp()
    rows = _by_id(measured_rows(e))
    pp512 = rows["xd-4090-24gb-l3-8b-q4-k-m-pp512"]      # llama-bench pp512: the estimate's prompt
    assert pp512["metric"] == "prefill_tps" and pp512["value"] == pytest.approx(7138.99)
    assert pp512["ratio_to_prediction"] == pytest.approx(7138.99 / e.results["prefill_tps"])
    assert pp512["engine"] == "llama.cpp" and pp512["source"] == "xiongjiedai-gpu-bench" and pp512["date"] == "2024-05"
    assert pp512["settings"] == {"batch": 1, "concurrency": None, "request_rate": None, "input_len": 512,
                                 "output_len": 0, "n_gpus": 1, "context_depth": 0,
                                 "attention_dp": False}
    # tg512 against an output of 128, pp8192 against a prompt of 512, F16 against Q4_K_M: no ratio
    for other in ("xd-4090-24gb-l3-8b-q4-k-m-tg512", "xd-4090-24gb-l3-8b-q4-k-m-pp8192", "xd-4090-24gb-l3-8b-f16-pp512"):
        assert rows[other]["ratio_to_prediction"] is None
    # same format first
    formats = [r["weight_format"] for r in measured_rows(e)]
    assert formats == sorted(formats, key=lambda f: f != "Q4_K_M")
    # then the estimate's engine: llama.cpp's F16 runs before ExLlamaV2's 8-bit ones on the same card
    others = [r["engine"] for r in measured_rows(e, limit=1000) if r["weight_format"] != "Q4_K_M"]
    assert {"llama.cpp", "ExLlamaV2"} <= set(others)
    assert others == sorted(others, key=lambda engine: engine != "llama.cpp")


def test_a_decode_row_matches_the_output_length():
    e = _llama_cpp(output_tokens=512)
    tg = _by_id(measured_rows(e))["xd-4090-24gb-l3-8b-q4-k-m-tg512"]
    assert tg["ratio_to_prediction"] == pytest.approx(130.58 / e.decode_tps_per_seq)
    assert measured_rows(e)[0]["ratio_to_prediction"] is not None    # rows with a ratio before those without


def test_a_row_of_other_attention_or_batch_has_no_ratio():
    assert all(r["ratio_to_prediction"] is None for r in measured_rows(_llama_cpp(attention="fused")))
    assert all(r["ratio_to_prediction"] is None for r in measured_rows(_llama_cpp(batch=4)))


def test_a_model_without_rows_gives_none():
    assert measured_rows(estimate("qwen2.5-0.5b", "h100")) == []


def test_at_most_ten_rows():
    assert len(measured_rows(estimate("llama-3.1-8b", "h100", concurrency=16))) <= LIMIT == 10


def test_llama_cpp_command():
    commands = verify_commands(_llama_cpp(attention="fused"))
    assert [c["tool"] for c in commands] == ["llama-bench", "roofline"]
    flags = command_flags(commands[0]["command"])
    assert commands[0]["command"].startswith("llama-bench -m Llama-3-8B-Q4_K_M.gguf")
    assert (flags["-p"], flags["-n"], flags["-b"], flags["-ngl"], flags["-fa"]) == ("512", "128", "2048", "99", "1")
    assert command_flags(verify_commands(_llama_cpp(gpu_layers=20))[0]["command"])["-ngl"] == "20"


def test_llama_cpp_batch_adds_batched_bench():
    commands = verify_commands(_llama_cpp(batch=8))
    batched = command_flags(commands[1]["command"])
    assert commands[1]["tool"] == "llama-batched-bench"
    assert (batched["-npp"], batched["-ntg"], batched["-npl"], batched["-c"]) == ("512", "128", "8", str(8 * 640))


def test_a_moe_batch_names_the_batched_bench_builds_that_feed_random_tokens():
    """llama-batched-bench fed every sequence token 0 until August 2025, so a MoE model routed a batch as one
    sequence (docs/formulas.md §9): the command for a MoE batch says which builds measure it; a dense one's does not."""
    moe = verify_commands(estimate("qwen3-30b-a3b", "rtx 4090", weight_format="Q4_K_M", engine="llama.cpp",
                                   batch=8))
    assert moe[1]["tool"] == "llama-batched-bench" and moe[1]["note"].startswith("use a build from August 2025 on")
    assert "    (use a build from August 2025 on" in format_verify(moe)
    assert "note" not in verify_commands(_llama_cpp(batch=8))[1]


def test_a_gguf_format_picks_llama_cpp_whatever_the_engine():
    assert verify_commands(estimate(LLAMA3, "h100", weight_format="Q8_0"))[0]["tool"] == "llama-bench"


def test_vllm_static_batch():
    e = estimate("llama-3.1-70b", "h100", n_gpus=2, weight_format="fp8", batch=8, prompt_tokens=1024,
                 output_tokens=64, engine="vllm")
    commands = verify_commands(e)
    assert [c["tool"] for c in commands] == ["vLLM", "roofline"]
    assert commands[0]["command"].startswith("vllm bench latency --model meta-llama/Llama-3.1-70B")
    flags = command_flags(commands[0]["command"])
    assert (flags["--input-len"], flags["--output-len"], flags["--batch-size"], flags["--tensor-parallel-size"],
            flags["--quantization"]) == ("1024", "64", "8", "2", "fp8")


def test_vllm_under_concurrency_and_rate():
    commands = verify_commands(estimate("llama-3.1-8b", "h100", concurrency=16, prompt_tokens=300, output_tokens=200))
    assert commands[0]["command"] == "vllm serve meta-llama/Llama-3.1-8B"
    flags = command_flags(commands[1]["command"])
    assert commands[1]["command"].startswith("vllm bench serve --model meta-llama/Llama-3.1-8B")
    assert (flags["--dataset-name"], flags["--random-input-len"], flags["--random-output-len"],
            flags["--max-concurrency"]) == ("random", "300", "200", "16")
    assert "--tensor-parallel-size" not in flags
    rated = command_flags(verify_commands(estimate("llama-3.1-8b", "h100", rate=2.5))[1]["command"])
    assert rated["--request-rate"] == "2.5" and "--max-concurrency" not in rated


def test_mlx_on_an_apple_device():
    commands = verify_commands(estimate("llama-3.1-8b", "m2 ultra", batch=4, prompt_tokens=256, output_tokens=100))
    assert [c["tool"] for c in commands] == ["MLX", "roofline"]
    flags = command_flags(commands[0]["command"])
    assert (flags["--model"], flags["-p"], flags["-g"], flags["-b"]) == ("meta-llama/Llama-3.1-8B", "256", "100", "4")
    assert command_flags(commands[1]["command"])["--device"] == "mps"


def test_roofline_validate_local_always():
    e = estimate("llama-3.1-8b", "h100", batch=2, prompt_tokens=128, output_tokens=32)
    local = verify_commands(e)[-1]
    flags = command_flags(local["command"])
    assert local["command"].startswith("roofline validate --local")
    assert (flags["--model"], flags["--batch"], flags["--prompt"], flags["--output"], flags["--device"]) == \
        ("meta-llama/Llama-3.1-8B", "2", "128", "32", "cuda")


def test_commands_are_a_pure_function_of_the_inputs():
    e = _llama_cpp()
    assert commands_for(inputs_of(e)) == commands_for(dict(inputs_of(e))) == verify_commands(e)


def test_the_printed_local_command_parses(capsys):
    """The roofline command it prints is one this CLI accepts (checked without running it)."""
    from estimator.cli_flags import parse
    local = verify_commands(_llama_cpp())[-1]["command"]
    args = parse(shlex.split(local)[1:])
    assert args.local and args.batch == [1] and args.prompt == [512]


def _cli(capsys, *argv):
    code = main(list(argv))
    out, _ = capsys.readouterr()
    return code, out


ESTIMATE = ("--model", LLAMA3, "--gpu", RTX4090, "--format", "Q4_K_M", "--engine", "llama.cpp",
            "--prompt", "512", "--output", "128", "--attention", "unfused")


def test_cli_json_has_both_keys(capsys):
    code, out = _cli(capsys, "estimate", *ESTIMATE, "--json")
    data = json.loads(out)
    assert code == 0 and data["measured"] and data["verify_command"]
    assert any(r["ratio_to_prediction"] for r in data["measured"])
    assert {"metric", "value", "unit", "engine", "source", "date", "ratio_to_prediction", "settings"} <= \
        data["measured"][0].keys()
    assert data["verify_command"][0]["command"].startswith("llama-bench")


def test_cli_text_has_both_sections(capsys):
    code, out = _cli(capsys, "estimate", *ESTIMATE)
    assert code == 0 and "Measured (measurements_db" in out and "measured/predicted" in out
    assert "Verify it yourself" in out and "llama-bench -m" in out
    code, out = _cli(capsys, "estimate", "--model", "qwen2.5-0.5b", "--gpu", "h100")
    assert code == 0 and "none published" in out and "vllm bench latency" in out


def test_cli_explain_has_both(capsys):
    code, out = _cli(capsys, "explain", *ESTIMATE, "--json")
    data = json.loads(out)
    assert code == 0 and {"estimate", "changes", "measured", "verify_command"} <= data.keys()
    code, out = _cli(capsys, "explain", *ESTIMATE)
    assert code == 0 and "Measured (measurements_db" in out and "Verify it yourself" in out


def test_a_measurement_is_compared_only_under_its_own_layout():
    """TensorRT-LLM's DeepSeek-R1 best-practice run on 8 x H200 used attention DP: an estimate of the same load
    with attention DP gets its ratio, one under plain TP lists it without (a different configuration)."""
    kwargs = dict(n_gpus=8, ep=8, weight_format="fp8", concurrency=1024, prompt_tokens=1024, output_tokens=2048,
                  engine="TensorRT-LLM")

    def best_practice(e):
        return [r for r in measured_rows(e, limit=500) if r["id"] == "trtdsr1bp-h200-fp8-c1024-throughput"][0]
    dep = best_practice(estimate("deepseek-v3", "h200", attention_dp=True, **kwargs))
    tp = best_practice(estimate("deepseek-v3", "h200", **kwargs))
    assert dep["settings"]["attention_dp"] and dep["ratio_to_prediction"] is not None
    assert tp["ratio_to_prediction"] is None
    assert "attention DP" in format_measured([dep])


def test_a_single_clients_decode_is_compared_with_a_batch_of_one():
    """InferenceX's one-client run of DeepSeek-R1 on 8 x B200 (SGLang 0.5.12, 921/921 tokens): its ITL is a batch-1
    decode step, so a static batch-1 estimate and a one-client estimate both get its ratio; its TTFT carries the
    server's front end and its throughput is a closed loop's, so neither compares with a static batch; a batch of
    two is another load."""
    kwargs = dict(n_gpus=8, engine="SGLang", weight_format="fp8", prompt_tokens=921, output_tokens=921)
    run = "ix3363-b200-1k1k-tp8ep1-c1-5c7bfe"

    def rows(**load):
        e = estimate("deepseek-v3", "b200", **kwargs, **load)
        return e, _by_id(measured_rows(e, limit=500))
    static, found = rows(batch=1)
    assert found[f"{run}-tpot"]["ratio_to_prediction"] == pytest.approx(7.18 / (static.results["itl_s"] * 1e3))
    assert found[f"{run}-ttft"]["ratio_to_prediction"] is None
    assert found[f"{run}-outgpu"]["ratio_to_prediction"] is None
    one_client, found = rows(concurrency=1)
    assert found[f"{run}-tpot"]["ratio_to_prediction"] == pytest.approx(7.18 / (one_client.results["itl_s"] * 1e3))
    assert found[f"{run}-ttft"]["ratio_to_prediction"] is not None
    assert rows(batch=2)[1][f"{run}-tpot"]["ratio_to_prediction"] is None
