"""Bad input at every edge: one clear line and exit code 2, never a traceback, an Infinity or an ignored flag.

Each test names a case a new user hit (the issue "Robustness: no traceback, no Infinity, no silently
ignored option"); tests/test_fuzz_cli.py generates many more.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

import pytest

from estimator import cli
from estimator.efficiency.calibration_profile import SCHEMA_VERSION
from estimator.errors import ConfigurationError, DatabaseError, UnknownNameError, read_text, write_atomically
from estimator.formatting import gigabytes, rate, seconds, to_json

BASE = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100"]
DISAGG = [*BASE, "--rate", "4", "--prefill-gpus", "1", "--decode-gpus", "1", "--json"]
PROFILE = str(Path(__file__).parents[1] / "hardware_db" / "calibrations" / "amd-epyc-2-vcpu-ci-machine.yaml")
DROP = object()   # a key left out of a config.json


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def refused(*argv) -> str:
    """The one line a refused command prints; it must exit 2 and print nothing else."""
    code, out, err = run(*argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, (code, out, err)
    assert "Traceback" not in err and "Error:" not in err
    return err


def strict_json(text: str):
    def no_constant(name):
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=no_constant)


@pytest.mark.parametrize("flag, value", [
    ("--network-gbps", "0"), ("--network-gbps", "-1"), ("--network-gbps", "nan"), ("--network-gbps", "inf"),
    ("--devices-per-node", "0"), ("--devices-per-node", "-1"), ("--rate", "inf"), ("--rate", "nan"),
    ("--acceptance", "1.5"), ("--batch", "1e30"), ("--prompt", ""), ("--gpus", "text"),
])
def test_a_bad_flag_value_names_the_flag_the_value_and_what_is_accepted(flag, value):
    err = refused(*BASE, flag, value, "--json")
    assert err.startswith(f"roofline estimate: error: argument {flag}: expected ") and repr(value) in err


def test_a_name_no_file_system_takes_is_an_unknown_name():
    assert "expected a name or path of 1 to 4,096" in refused("estimate", "--model", "x" * 5000, "--gpu", "h100")
    assert "unknown model" in refused("estimate", "--model", "x" * 1200, "--gpu", "h100")
    from estimator.evaluation.api import resolve_model
    from estimator.specs.database import load_database
    with pytest.raises(UnknownNameError):
        resolve_model("x" * 5000, load_database())
    with pytest.raises(UnknownNameError):
        resolve_model("h100\x00", load_database())


@pytest.mark.parametrize("engine", ["vllm@nonsense", "llama.cpp@b6918", "llama.cpp@"])
def test_an_engine_suffix_that_is_neither_a_backend_nor_a_release_is_refused(engine):
    """vLLM@nonsense used to run as vLLM under that name; a build tag is not a release number either."""
    err = refused("estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--engine", engine)
    assert "cuda, rocm, metal, vulkan, sycl, cpu" in err and "release number" in err


def test_an_engine_on_a_named_backend_or_release_still_runs():
    for engine in ("llama.cpp@Vulkan", "vLLM@rocm", "vLLM@0.7.3"):
        code, out, _ = run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100", "--engine", engine, "--json")
        assert code == 0 and strict_json(out)


@pytest.mark.parametrize("content", [bytes(range(256)) * 4, "name: caf\xe9\n".encode("latin-1")])
def test_binary_or_non_utf8_files_are_refused(tmp_path, content):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(content)
    for argv in ([*BASE, "--calibration", str(bad)], ["predict", "--csv", str(bad), "--out", str(tmp_path / "o.csv")],
                 ["plan", str(bad)], ["report", str(bad), "--out", str(tmp_path / "r.html")],
                 ["calibrate", "--compare", str(bad), str(bad)]):
        assert "is not UTF-8 text" in refused(*argv)
    assert bad.read_bytes() == content


@pytest.mark.parametrize("config, message", [
    ({"num_attention_heads": 0}, "num_attention_heads must be a whole number >= 1, got 0"),
    ({"hidden_size": "wide"}, "hidden_size must be a whole number >= 1, got 'wide'"),
    ({"vocab_size": None}, "vocab_size = None: Input should be a valid integer"),
    ({"vocab_size": DROP}, "cannot read model shapes from this config.json (no 'vocab_size'); write a models_db"),
    ({"hidden_size": DROP}, "cannot read model shapes from this config.json (no hidden_size)"),
    ({"intermediate_size": 10**30}, "intermediate_size = 1000000000000000000000000000000: Input should be less"),
    ({"text_config": [1]}, "text_config must be a JSON object"),
])
def test_a_bad_config_json_names_the_field(tmp_path, config, message):
    base = {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
            "intermediate_size": 8192, "vocab_size": 128256, "model_type": "llama"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in {**base, **config}.items() if v is not DROP}))
    assert message in refused("estimate", "--model", str(path), "--gpu", "h100")


@pytest.mark.parametrize("text, message", [("[1, 2]", "holds a JSON object, got list"),
                                           ('{"hidden_size": NaN}', "NaN is not a number JSON allows")])
def test_a_config_json_that_is_not_an_object_of_numbers(tmp_path, text, message):
    path = tmp_path / "config.json"
    path.write_text(text)
    assert message in refused("estimate", "--model", str(path), "--gpu", "h100")


def test_yaml_infinities_and_nans_are_refused(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("models: [llama-3.1-8b]\nworkload: {prompt: 10, output: 1, rate: .inf}\n")
    assert "workload.rate is not a finite number" in refused("plan", str(plan))
    plan.write_text("models: [llama-3.1-8b]\nworkload: {prompt: 10, output: 1, rate: [\n")
    assert "not valid YAML" in refused("plan", str(plan))


@pytest.mark.parametrize("line, replacement, message", [
    ("  read_bandwidth_bytes_per_s: 30958385346.13745", "  read_bandwidth_bytes_per_s: 1.0e-300",
     "summary.read_bandwidth_bytes_per_s = 1e-300 is not a measured rate; expected 1e+06 to 1e+18"),
    ("    fp32: 168602726008.0278", "    fp32: -5", "summary.gemm_flops_per_s.fp32 = -5 is not a measured rate"),
    ("  read_bandwidth_bytes_per_s: 30958385346.13745", "  read_bandwidth_bytes_per_s: .inf",
     "summary.read_bandwidth_bytes_per_s is not a finite number"),
    ("schema_version: 1", f"schema_version: 1\nschema_version: {SCHEMA_VERSION + 1}", "not a valid calibration profile"),
])
def test_a_calibration_profile_with_rates_no_device_measures_is_refused(tmp_path, line, replacement, message):
    text = Path(PROFILE).read_text()
    assert line in text
    path = tmp_path / "profile.yaml"
    path.write_text(text.replace(line, replacement, 1))
    for gpu in ("h100", "local"):
        assert message in refused("estimate", "--model", "qwen2.5-0.5b", "--gpu", gpu, "--calibration", str(path))


def test_outputs_go_into_new_folders_atomically(tmp_path):
    plot = tmp_path / "new" / "deeper" / "spec.png"
    code, out, _ = run("speculation", "--model", "llama-3.1-8b", "--gpu", "l4", "--out", str(plot))
    assert code == 0 and plot.stat().st_size > 1000 and "plot written to" in out
    assert "exists; pass --force" in refused("speculation", "--model", "llama-3.1-8b", "--gpu", "l4", "--out",
                                             str(plot))
    assert "cannot write a .gif image" in refused("speculation", "--model", "llama-3.1-8b", "--gpu", "l4",
                                                  "--out", str(tmp_path / "x.gif"))
    assert "is a folder" in refused("speculation", "--model", "llama-3.1-8b", "--gpu", "l4", "--out", str(tmp_path))
    assert sorted(p.name for p in plot.parent.iterdir()) == ["spec.png"]   # no temporary file left behind


def test_predict_writes_into_a_new_folder(tmp_path):
    csv = tmp_path / "in.csv"
    csv.write_text("id,framework,hardware,n_gpus,model,weight_format,kv_format,batch,input_len,output_len,metric\n"
                   "a,vllm,h100,1,llama-3.1-8b,bf16,,1,512,128,itl_ms\n")
    out = tmp_path / "results" / "out.csv"
    code, text, _ = run("predict", "--csv", str(csv), "--out", str(out))
    assert code == 0 and out.exists() and "wrote 1 rows" in text


def test_write_atomically_keeps_the_old_file_when_writing_fails(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")

    def fail(tmp):
        tmp.write_text("half")
        raise OSError(28, "No space left on device")
    with pytest.raises(ConfigurationError, match="cannot write --out .*No space left on device"):
        write_atomically(path, fail, force=True, flag="--out")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]
    with pytest.raises(ConfigurationError, match="exists; pass --force"):
        write_atomically(path, lambda tmp: tmp.write_text("new"), force=False, flag="--out")
    write_atomically(path, lambda tmp: tmp.write_text("new"), force=True, flag="--out")
    assert path.read_text() == "new"


def test_read_text_says_what_is_wrong(tmp_path):
    with pytest.raises(DatabaseError, match="cannot read plan .*No such file"):
        read_text(tmp_path / "missing.yaml", "plan")
    with pytest.raises(DatabaseError, match="cannot read plan .*Is a directory"):
        read_text(tmp_path, "plan")


def test_validate_write_needs_force_and_a_folder(tmp_path):
    assert "pass --force to overwrite them" in refused("validate", "--published", "--write", str(tmp_path))
    assert "not a folder" in refused("validate", "--published", "--write", str(tmp_path / "no"), "--force")
    assert "apply to --published, not --local" in refused("validate", "--local", "--plot", "x.png")
    assert "--no-cache: apply to --published, not --local" in refused("validate", "--local", "--no-cache")
    assert "apply to --local, not --published" in refused("validate", "--published", "--quick")
    assert "add one of them" in refused("validate", "--published", "--force")


def test_validate_local_without_torch_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)   # `import torch` now raises ImportError
    err = refused("validate", "--local", "--quick")
    assert "install them with: pip install 'llm-roofline[calibrate]'" in err


def test_validate_published_without_the_fit_extra_says_how_to_install_it(monkeypatch):
    """Said at once, before the dataset is resolved, and naming the module that is missing."""
    from estimator.validation import published
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    monkeypatch.setattr(published, "build_problem", lambda *a, **k: pytest.fail("resolved before the check"))
    err = refused("validate", "--published", "--no-cache")
    assert "fitting needs the fit extra: pip install 'llm-roofline[fit]'" in err and "threadpoolctl" in err


def test_an_unexpected_error_is_one_line_with_its_own_exit_code(monkeypatch):
    def broken(args):
        return 1 / 0
    monkeypatch.setattr(cli, "run", broken)
    code, out, err = run(*BASE)
    assert code == 3 and out == "" and len(err.splitlines()) == 1
    assert "unexpected error (ZeroDivisionError: division by zero); rerun with --debug for the traceback" in err
    code, _, err = run(*BASE, "--debug")
    assert code == 3 and "Traceback (most recent call last)" in err and "rerun with --debug" not in err
    code, _, err = run("--debug", *BASE)
    assert code == 3 and "Traceback" in err


def test_help_exits_0():
    code, out, _ = run("estimate", "--help")
    assert code == 0 and "--network-gbps" in out


def test_a_configuration_that_does_not_fit_has_no_speed_at_all():
    code, out, _ = run("estimate", "--model", "llama-3.1-70b", "--gpu", "rtx 4090", "--rate", "1", "--json")
    data = strict_json(out)
    assert code == 0 and data["fits"] is False
    speeds = [k for k in data if k.endswith(("_tps", "_tps_per_seq", "_tps_total", "_tps_per_gpu", "_s", "_rate"))
              and not k.startswith(("prefill_", "decode_")) and k not in ("max_rate", "prefix_hit_rate")]   # not speeds
    assert "throughput_out_tps_per_gpu" in speeds and "request_rate" in speeds
    assert {k: data[k] for k in speeds if data[k] is not None} == {}


@pytest.mark.parametrize("argv, message", [
    ([*BASE, "--rate", "2", "--batch", "8"], "--batch: under --concurrency or --rate the batch is the steady state"),
    ([*BASE, "--acceptance", "0.8"], "--acceptance: applies to speculative decoding"),
    ([*BASE, "--host-cpu", "amd epyc 9654"], "--host-cpu: runs what --gpu-layers or --cpu-moe leaves to the host"),
    ([*BASE, "--kv-alloc", "contiguous", "--kv-block", "32"], "--kv-block: sizes paged KV blocks"),
    ([*BASE, "--max-ttft-s", "1"], "--max-ttft-s: targets of the disaggregated-serving search"),
    ([*BASE, "--draft-model", "llama-3.2-1b", "--draft-cost", "0.1", "--draft-tokens", "4"], "give one of them"),
    (["explain", *BASE[1:], "--prefill-gpus", "1"], "disaggregated serving is a mode of `roofline estimate`"),
    (["speculation", *BASE[1:], "--draft-tokens", "4"], "sweeps γ and α itself"),
    (["speculation", *BASE[1:], "--force"], "--force: overwrites --out; add --out FILE"),
    ([*DISAGG, "--batch", "4"], "--batch: not used by disaggregated serving"),
    ([*DISAGG, "--gpus", "2"], "--gpus: not used by disaggregated serving"),
    ([*DISAGG, "--chunked-prefill", "256"], "--chunked-prefill: not used by disaggregated serving"),
    (["list", "gpus", "--family", "llama"], "--family: not used by `roofline list gpus`"),
    (["list", "models", "--vendor", "AMD", "--min-memory-gib", "8"], "--vendor, --min-memory-gib: not used by"),
    (["list", "formats", "--moe", "--db", "."], "--moe, --db: not used by `roofline list formats`"),
    (["calibrate", "--compare", PROFILE, PROFILE, "--device", "cpu"], "--device: not used by --compare"),
    (["calibrate", "--force"], "--force: overwrites --out; add --out FILE"),
])
def test_a_flag_the_mode_would_not_use_is_refused(argv, message):
    assert message in refused(*argv)


def test_a_plan_file_and_plan_flags_are_not_mixed(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("models: [llama-3.1-8b]\nworkload: {prompt: 512, output: 128, concurrency: 8}\n"
                    "constraints: {gpus: [h100], max_gpus: 2}\n")
    err = refused("plan", str(plan), "--model", "llama-3.1-70b", "--on-prem")
    assert "--model, --on-prem: the plan file" in err and "put them in the file, or drop the file" in err
    code, out, _ = run("plan", str(plan), "--json")
    assert code == 0 and strict_json(out)["configurations"]


def test_plan_flags_leave_the_rest_to_the_plans_defaults():
    code, out, _ = run("plan", "--model", "llama-3.1-8b", "--prompt", "512", "--output", "128", "--concurrency", "8",
                       "--gpus", "h100", "--max-gpus", "2", "--price", "h100=2.5", "--json")
    data = strict_json(out)
    assert code == 0 and {c["hardware"] for c in data["configurations"]} == {"NVIDIA H100 SXM"}
    assert data["prices"][0]["usd_per_device_hour"] == 2.5
    assert "expected DEVICE=USD with USD above 0" in refused("plan", "--model", "x", "--price", "h100=-2")


def test_disaggregated_serving_honours_the_engine_and_the_serving_options():
    def latencies(*extra):
        code, out, _ = run(*DISAGG, *extra)
        assert code == 0
        data = strict_json(out)
        return data["disaggregated"]["ttft_s"], data["disaggregated"]["itl_s"], data["aggregated"]["itl_s"]
    generic = latencies()
    engines = {latencies("--engine", e) for e in ("TensorRT-LLM", "llama.cpp")}
    assert len(engines | {generic}) == 3
    assert latencies("--kv-format", "fp8") != generic and latencies("--attention", "unfused") != generic
    two = ("--tp", "2", "--prefill-gpus", "2", "--decode-gpus", "2")
    assert latencies(*two, "--network-gbps", "100", "--devices-per-node", "1") != latencies(*two)


def test_disaggregated_serving_honours_the_calibration():
    code, out, _ = run(*DISAGG, "--calibration", PROFILE)   # a CPU's bandwidth borrowed by an H100
    calibrated = strict_json(out)
    _, out, _ = run(*DISAGG, "--calibration", "none")
    datasheet = strict_json(out)
    assert code == 0 and calibrated["disaggregated"]["kv_transfer_s"] == datasheet["disaggregated"]["kv_transfer_s"]
    assert calibrated["disaggregated"]["saturated"] and not datasheet["disaggregated"]["saturated"]


def test_text_and_json_never_show_a_non_finite_number():
    assert (seconds(float("inf")), rate(float("nan")), gigabytes(float("-inf"))) == ("n/a", "n/a", "n/a")
    assert strict_json(to_json({"a": float("inf"), "b": [float("nan"), 1.0], "c": (2,)})) == \
        {"a": None, "b": [None, 1.0], "c": [2]}
