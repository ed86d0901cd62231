"""The `roofline` command line, in-process (main(argv)) and once as an installed console script."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess

import pytest

from tests.helpers import cli

REQUIRED_JSON_KEYS = {"ttft_s", "decode_tps_per_seq", "decode_tps_total", "itl_s", "e2e_latency_s",
                      "prefill_bound", "decode_bound", "memory_required_bytes", "memory_available_bytes",
                      "fits", "max_batch"}



def test_estimate_prints_the_report(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "RTX 4090", "--format", "Q4_K_M")
    assert code == 0
    for text in ("TTFT", "decode tokens/s per sequence", "memory-bound", "ridge point", "fits", "Definitions",
                 "kv read"):
        assert text in out


def test_estimate_json_has_the_documented_keys(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "mixtral-8x7b", "--gpu", "H100", "--gpus", "2",
                       "--batch", "8", "--json")
    data = json.loads(out)
    assert code == 0 and REQUIRED_JSON_KEYS <= data.keys()
    assert data["fits"] is True and data["decode_bound"] in ("memory", "compute", "overhead")
    assert data["decode_tps_total"] == pytest.approx(8 * data["decode_tps_per_seq"])


def test_model_that_does_not_fit_says_need_and_have(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-70b", "--gpu", "rtx 4090", "--format", "bf16")
    assert code == 0
    assert "DOES NOT FIT: needs" in out and "has 25.77 GB" in out
    assert "decode tokens/s per sequence" not in out
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-70b", "--gpu", "rtx 4090", "--json")
    data = json.loads(out)
    assert data["fits"] is False and data["decode_tps_per_seq"] is None and data["memory_required_bytes"] > 1e11


def test_unknown_gpu_lists_closest_names(capsys):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "RTX 4009")
    assert code == 2
    assert err.startswith("roofline estimate: error: unknown gpu 'RTX 4009'") and "RTX 4090" in err
    assert len(err.splitlines()) == 1 and "UnknownNameError" not in err


def test_unknown_model_and_format_are_clear_errors(capsys):
    code, _, err = cli(capsys, "estimate", "--model", "lama-3-8b", "--gpu", "h100")
    assert code == 2 and "Closest:" in err and "Llama-3-8B" in err
    code, _, err = cli(capsys, "estimate", "--model", "llama-3-8b", "--gpu", "h100", "--format", "int3")
    assert code == 2 and "unknown weight format 'int3'" in err and "Q4_K_M" in err


@pytest.mark.parametrize("argv, message", [
    (["--batch", "0"], "argument --batch: expected a whole number from 1 to 1,000,000,000, got '0'"),
    (["--prompt", "0"], "argument --prompt: expected a whole number from 1"),
    (["--gpus", "3", "--tp", "3"], "cannot split evenly"),
])
def test_impossible_workloads_are_rejected(capsys, argv, message):
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", *argv)
    assert code == 2 and message in err and "Traceback" not in err + out and len(err.splitlines()) == 1


def test_a_bad_flag_value_is_one_line_with_exit_code_2(capsys):
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--batch", "two")
    assert code == 2 and out == ""
    assert err == ("roofline estimate: error: argument --batch: expected a whole number from 1 to 1,000,000,000, "
                   "got 'two' (see roofline estimate --help)\n")
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--network-gbps", "nan")
    assert code == 2 and "argument --network-gbps: expected a number from 0.001 to 1e+06, got 'nan'" in err


def test_list_and_filters(capsys):
    code, out, _ = cli(capsys, "list", "gpus", "--vendor", "AMD")
    assert code == 0 and "MI300X" in out and "H100" not in out
    _, out, _ = cli(capsys, "list", "models", "--moe", "--json")
    models = json.loads(out)
    assert models and all(m["moe"] for m in models)
    _, out, _ = cli(capsys, "list", "formats")
    assert "Q4_K_M" in out and "nvfp4" in out and "q4" in out
    _, out, _ = cli(capsys, "list", "gpus", "--min-memory-gib", "100", "--json")
    assert all(g["memory_gib"] >= 100 for g in json.loads(out))


def test_show_prints_every_field_with_its_source(capsys):
    code, out, _ = cli(capsys, "show", "gpu", "NVIDIA H100 80GB HBM3")
    assert code == 0 and "memory.bandwidth" in out and "dense_peak.bf16" in out and "https://" in out
    code, out, _ = cli(capsys, "show", "model", "deepseek-ai/DeepSeek-V3")
    assert code == 0 and "shape.mla.kv_lora_rank" in out and "68.6 KiB" in out


def test_estimate_from_a_local_config_json(capsys, tmp_path):
    config = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
              "head_dim": 64, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True,
              "max_position_embeddings": 131072, "model_type": "llama"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    code, out, _ = cli(capsys, "estimate", "--model", str(tmp_path / "config.json"), "--gpu", "l4", "--json")
    assert code == 0 and json.loads(out)["fits"] is True


def test_user_database_folder(capsys, tmp_path):
    import yaml

    from estimator.specs.database import load_database
    entry = load_database().hardware.get("rtx 4090").model_dump(mode="json")
    entry.update(name="My Lab Card", aliases=["labcard"])
    (tmp_path / "lab.yaml").write_text(yaml.safe_dump(entry))
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "labcard", "--db", str(tmp_path))
    assert code == 0 and "My Lab Card" in out


def _write_csv(path, rows):
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_predict_keeps_going_past_unknown_rows(capsys, tmp_path):
    good = {"id": "a", "framework": "vllm", "hardware": "NVIDIA H100 80GB HBM3", "n_gpus": "1",
            "model": "meta-llama/Llama-3.1-8B-Instruct", "weight_format": "bf16", "kv_format": "",
            "batch": "1", "input_len": "512", "output_len": "128", "metric": "itl_ms", "value": "8.0", "unit": "ms"}
    rows = [good, {**good, "id": "b", "hardware": "TPU v9"}, {**good, "id": "c", "model": "gpt-5"},
            {**good, "id": "d", "metric": "joules"}, {**good, "id": "e", "value": "", "metric": "ttft_ms"}]
    _write_csv(tmp_path / "in.csv", rows)
    code, out, _ = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.csv"))
    assert code == 0 and "wrote 5 rows" in out
    result = {r["id"]: r for r in csv.DictReader((tmp_path / "out.csv").open())}
    assert result["a"]["status"] == "ok" and float(result["a"]["predicted"]) > 0 and result["a"]["rel_error"]
    assert result["b"]["status"] == "unknown_hardware" and "TPU v9" in result["b"]["reason"]
    assert result["c"]["status"] == "unknown_model"
    assert result["d"]["status"] == "invalid" and "unknown metric" in result["d"]["reason"]
    assert result["e"]["status"] == "ok" and result["e"]["rel_error"] == ""


def test_predict_marks_a_bad_word_cell_invalid_and_runs_the_rest(capsys, tmp_path):
    """A backend, statistic or token_ids cell that is none of its words is that row's error, named: a misspelt backend
    used to stop the whole run with an error about an engine 'generic@cudaa' the file never named, and an unknown
    statistic was compared with the mean."""
    good = {"id": "a", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "bf16",
            "batch": "1", "input_len": "512", "output_len": "128", "metric": "itl_ms", "backend": "",
            "statistic": "", "token_ids": ""}
    rows = [good, {**good, "id": "b", "backend": "cudaa"}, {**good, "id": "c", "statistic": "p95"},
            {**good, "id": "d", "token_ids": "bogus"}]
    _write_csv(tmp_path / "in.csv", rows)
    code, out, _ = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.csv"))
    assert code == 0 and "wrote 4 rows" in out
    result = {r["id"]: r for r in csv.DictReader((tmp_path / "out.csv").open())}
    assert result["a"]["status"] == "ok"
    for key, column, word in (("b", "backend", "cudaa"), ("c", "statistic", "p95"), ("d", "token_ids", "bogus")):
        assert result[key]["status"] == "invalid" and column in result[key]["reason"] and word in result[key]["reason"]


def test_predict_never_overwrites_without_force(capsys, tmp_path):
    (tmp_path / "out.csv").write_text("precious")
    _write_csv(tmp_path / "in.csv", [{"id": "a", "framework": "", "hardware": "h100", "n_gpus": "1",
                                      "model": "llama-3.1-8b", "weight_format": "bf16", "kv_format": "",
                                      "batch": "1", "input_len": "8", "output_len": "8", "metric": "itl_ms"}])
    code, _, err = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.csv"))
    assert code == 2 and "--force" in err and (tmp_path / "out.csv").read_text() == "precious"
    code, _, _ = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "out.csv"),
                     "--force")
    assert code == 0 and "precious" not in (tmp_path / "out.csv").read_text()


def test_predict_refuses_a_column_the_schema_does_not_name(capsys, tmp_path):
    """A misspelt load column would be ignored and its rows run with no load (at the largest batch the engine runs):
    the file is refused in one line that names the column and its nearest schema column, and nothing is written."""
    row = {"id": "a", "hardware": "h100", "n_gpus": "1", "model": "llama-3.1-8b", "weight_format": "bf16",
           "batch": "", "concurency": "8", "input_len": "512", "output_len": "128", "metric": "itl_ms"}
    _write_csv(tmp_path / "in.csv", [row])
    code, out, err = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "o.csv"))
    assert code == 2 and not out and len(err.splitlines()) == 1 and not (tmp_path / "o.csv").exists()
    assert "unknown column 'concurency' (did you mean 'concurrency'?)" in err and "SCHEMA.md" in err
    _write_csv(tmp_path / "in.csv", [{**{k: v for k, v in row.items() if k != "concurency"}, "concurrency": "8"}])
    code, out, _ = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "o.csv"))
    assert code == 0 and "1 ok" in out


def test_predict_rejects_a_csv_without_required_columns(capsys, tmp_path):
    (tmp_path / "in.csv").write_text("id,model\n1,llama-3.1-8b\n")
    code, _, err = cli(capsys, "predict", "--csv", str(tmp_path / "in.csv"), "--out", str(tmp_path / "o.csv"))
    assert code == 2 and "missing columns" in err


@pytest.mark.skipif(shutil.which("roofline") is None, reason="console script not installed")
def test_console_script_runs_from_another_directory(tmp_path):
    done = subprocess.run(["roofline", "list", "gpus"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "NVIDIA H100 SXM" in done.stdout


def test_check_validates_and_compares_counts(capsys, tmp_path):
    code, out, _ = cli(capsys, "check")
    assert code == 0 and "all valid" in out and "Mixtral-8x7B" in out
    (tmp_path / "bad.yaml").write_text("name: x\nshape: {hidden_size: -1}\n")
    code, _, err = cli(capsys, "check", "--db", str(tmp_path))
    assert code == 2 and err.startswith("roofline check: error: ") and "bad.yaml" in err
    assert len(err.splitlines()) == 1 and "shape.hidden_size = -1: Input should be greater than 0" in err


@pytest.mark.parametrize("argv, message", [
    (["--model", "llama-3.1-8b", "--tp", "3"], "tp=3 tensor-parallel ranks cannot split evenly"),
    (["--model", "llama-3.1-8b", "--gpus", "6", "--tp", "4"], "6 devices cannot hold replicas of tp=4"),
    (["--model", "llama-3.1-8b", "--ep", "2", "--tp", "2"], "dense; expert parallelism needs an MoE model"),
    (["--model", "llama-3.2-1b", "--pp", "32"], "exceed Llama-3.2-1B's 16 layers"),
    (["--model", "mixtral-8x7b", "--tp", "2", "--ep", "4"], "ep=4 must divide"),
])
def test_impossible_layouts_are_rejected(capsys, argv, message):
    code, out, err = cli(capsys, "estimate", "--gpu", "h100", *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_layout_flags_reach_the_json(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-70b", "--gpu", "h100", "--gpus", "8", "--tp", "4",
                       "--pp", "1", "--batch", "16", "--json")
    data = json.loads(out)
    assert code == 0 and (data["tp"], data["pp"], data["dp"], data["n_gpus"]) == (4, 1, 2, 8)


@pytest.mark.parametrize("argv, message", [
    (["--kv-alloc", "contiguous", "--prefix-tokens", "100"], "prefix caching shares paged KV blocks"),
    (["--prefix-tokens", "600", "--prompt", "512"], "must be shorter than the prompt"),
    (["--kv-block", "0"], "argument --kv-block: expected a whole number from 1"),
    (["--kv-alloc", "contiguous", "--kv-block", "32"], "--kv-block: sizes paged KV blocks"),
])
def test_bad_serving_options(capsys, argv, message):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", *argv)
    assert code == 2 and message in err


def test_serving_options_reach_json(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--kv-alloc", "contiguous",
                       "--attention", "unfused", "--json")
    data = json.loads(out)
    assert code == 0 and data["kv_alloc"] == "contiguous" and data["attention"] == "unfused"
    assert data["max_concurrency"] == data["max_batch"] and data["kv_cache_bytes_per_token"] == 131072


@pytest.mark.parametrize("argv, message", [
    (["--gpu-layers", "8", "--offload", "auto"], "choose one kind of offload"),
    (["--gpu-layers", "8", "--gpus", "2"], "use --gpus 1"),
    (["--gpu-layers", "99"], "exceeds the layer count"),
    (["--gpu-layers", "8", "--host-cpu", "Pentium II"], "unknown gpu 'Pentium II'"),
])
def test_bad_offload_options(capsys, argv, message):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "rtx 4090", *argv)
    assert code == 2 and message in err


def test_offload_report_and_json(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "qwen3-30b-a3b", "--gpu", "rtx 4060 ti 16gb",
                       "--format", "Q8_0", "--offload", "auto")
    assert code == 0 and "offload-bound" in out and "PCIe" in out and "faster" in out
    code, out, _ = cli(capsys, "estimate", "--model", "qwen3-30b-a3b", "--gpu", "rtx 4060 ti 16gb",
                       "--format", "Q8_0", "--offload", "auto", "--json")
    data = json.loads(out)
    assert data["offloaded_bytes"] > 10e9 and data["decode_bound"] == "offload" and data["fits"] is True


def test_load_options(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--concurrency", "32")
    assert code == 0 and "32 requests in flight" in out and "TTFT (with queueing)" in out
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "500", "--json")
    data = json.loads(out)
    assert data["saturated"] is True and data["ttft_s"] is None and data["max_rate"] > 0
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--chunked-prefill", "512")
    assert code == 2 and "add --concurrency or --rate" in err
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--rate", "1",
                       "--concurrency", "2")
    assert code == 2 and "not allowed with argument" in err


def test_a_step_compute_bound_below_the_ridge_says_why(capsys):
    """gpt-oss-20b at batch 128 under llama.cpp: its expert GEMMs, padded to their tiles, outweigh the weight
    stream although the step's real FLOPs per byte are below the ridge; the text says so instead of leaving
    'compute-bound' beside an intensity under the ridge unexplained."""
    code, out, _ = cli(capsys, "estimate", "--model", "gpt-oss-20b", "--gpu", "rtx 4090", "--engine", "llama.cpp",
                       "--format", "mxfp4-moe", "--batch", "128", "--prompt", "256", "--output", "64")
    line = next(x for x in out.splitlines() if x.strip().startswith("decode step of 128 sequences:"))
    assert code == 0 and "compute-bound" in line and "< ridge point" in line and "padded to their row tiles" in line
