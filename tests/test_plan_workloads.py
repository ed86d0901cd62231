"""A plan's workload as a length mix served together, with a prefix-cache hit rate: judged as `estimate` judges it,
and carried into the report."""

from __future__ import annotations

import pytest
import yaml

from estimator.cli import main
from estimator.evaluation.api import estimate
from estimator.planning.search import plan
from estimator.planning.spec import DevicePrice, PlanSpec, Prices
from estimator.formatting import seconds
from estimator.reporting.procurement import _sensitivity
from estimator.serving.lengths import length_mix

PRICES = Prices(devices={"NVIDIA H100 SXM": DevicePrice(cloud_usd_per_hour=3.0),
                         "NVIDIA L40S": DevicePrice(cloud_usd_per_hour=1.3)})


def spec(workload: dict, **targets) -> PlanSpec:
    return PlanSpec.model_validate({
        "models": ["llama-3.1-8b"], "workload": workload, "targets": targets,
        "constraints": {"gpus": ["h100", "l40s"], "max_gpus": 2, "formats": ["fp8", "bf16"]}, "prices": PRICES})


def _estimate(c: dict, db, **serving):
    return estimate(c["model"], c["hardware"], n_gpus=c["count"], tp=c["tp"], weight_format=c["format"],
                    engine="vLLM", calibration=None, db=db, **serving)


def test_a_length_mix_is_judged_as_estimate_judges_it(db):
    workload = {"lengths": "sharegpt", "concurrency": 64, "prefix_hit_rate": 0.3}
    result = plan(spec(workload, max_ttft_s=2.0, latency_percentile="p99"), db)
    assert result.configurations
    for c in result.configurations[:4]:
        e = _estimate(c, db, lengths="sharegpt", concurrency=64, prefix_hit_rate=0.3)
        assert (c["ttft_s"], c["throughput_out_tps"], c["ttft_p99_s"]) == pytest.approx(
            (e.ttft_s, e.throughput_out_tps, e.ttft_p99_s), rel=1e-9)


def test_the_mix_is_not_its_means(db):
    """Served together, the mix's spread moves the tail: the same means as fixed lengths judge differently."""
    mixed = plan(spec({"lengths": "sharegpt", "concurrency": 64}, max_ttft_s=2.0, latency_percentile="p99"), db)
    request = mixed.spec.workload.requests[0]
    fixed = plan(spec({"prompt": request.prompt, "output": request.output, "concurrency": 64}, max_ttft_s=2.0,
                      latency_percentile="p99"), db)
    key = {(c["hardware"], c["count"], c["format"]): c["ttft_p99_s"] for c in fixed.configurations}
    pairs = [(c["ttft_p99_s"], key[k]) for c in mixed.configurations
             if (k := (c["hardware"], c["count"], c["format"])) in key]
    assert pairs and all(m > f for m, f in pairs)   # varied prompts queue behind long ones


def test_prefix_hits_never_raise_the_judged_ttft(db):
    ttft = {}
    for hit_rate in (0.0, 0.5, 0.9):
        result = plan(spec({"prompt": 4096, "output": 256, "concurrency": 16, "prefix_hit_rate": hit_rate},
                           max_ttft_s=5.0), db)
        ttft[hit_rate] = {(c["hardware"], c["count"], c["format"]): c["ttft_s"] for c in result.configurations}
    common = set(ttft[0.0]) & set(ttft[0.5]) & set(ttft[0.9])
    assert common
    for k in common:
        assert ttft[0.9][k] < ttft[0.5][k] < ttft[0.0][k]


def test_workload_keys_are_checked():
    with pytest.raises(ValueError, match="not prompt/output and lengths"):
        spec({"lengths": "chat", "prompt": 100, "output": 100, "concurrency": 4})
    with pytest.raises(ValueError, match="(?s)workload.lengths.*not a CSV file or a preset"):
        spec({"lengths": "no-such-mix", "concurrency": 4})
    with pytest.raises(ValueError, match="prefix_hit_rate"):
        spec({"prompt": 100, "output": 100, "concurrency": 4, "prefix_hit_rate": 1.5})


def test_cli_flags_and_plan_file_agree(tmp_path, capsys):
    flags = ["--model", "llama-3.1-8b", "--lengths", "chat", "--concurrency", "16", "--prefix-hit-rate", "0.5",
             "--gpus", "l40s", "--max-gpus", "1", "--formats", "fp8", "--json"]
    assert main(["plan", *flags]) == 0
    from_flags = capsys.readouterr().out
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"models": ["llama-3.1-8b"], "workload": {
        "lengths": "chat", "concurrency": 16, "prefix_hit_rate": 0.5},
        "constraints": {"gpus": ["l40s"], "max_gpus": 1, "formats": ["fp8"]}}))
    assert main(["plan", str(path), "--json"]) == 0
    assert capsys.readouterr().out == from_flags
    assert main(["plan", *flags[:-1]]) == 0
    text = capsys.readouterr().out
    assert "lengths chat (mean" in text and "50% of prompt tokens from the prefix cache" in text
    assert main(["plan", "--model", "llama-3.1-8b", "--lengths", "nope", "--concurrency", "4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "workload.lengths" in err[0] and "Error" not in err[0]


def test_the_reports_sensitivity_doubles_a_presets_prompts(db, tmp_path):
    s = spec({"lengths": "chat", "concurrency": 16}, max_ttft_s=5.0)
    result = plan(s, db)
    rows = {row[0]: row for row in _sensitivity(s, result, db)}
    mix, best = length_mix("chat"), result.configurations[0]
    longer = _estimate(best, db, lengths=f"chat@{2 * mix.mean_prompt_tokens}/{mix.mean_output_tokens}",
                       concurrency=16)
    assert rows["prompts twice as long"][1] == seconds(longer.ttft_s)
    assert rows["as planned"][1] == seconds(best["ttft_s"]) and longer.ttft_s > best["ttft_s"]
    # a file of requests is what it is: the case is said not to apply, not computed on the wrong lengths
    requests = tmp_path / "requests.csv"
    requests.write_text("prompt,output\n100,50\n900,300\n")
    file_spec = spec({"lengths": str(requests), "concurrency": 16}, max_ttft_s=5.0)
    file_rows = {row[0]: row for row in _sensitivity(file_spec, plan(file_spec, db), db)}
    assert file_rows["prompts twice as long"][-1].startswith("not computed")


def test_the_report_estimates_under_the_plans_running_limit(db):
    """The report's own estimates take every serving option of the plan: with a running limit below the clients,
    requests wait for a slot, and the 'as planned' row shows the TTFT the plan judged."""
    s = spec({"prompt": 1024, "output": 256, "concurrency": 32, "max_num_seqs": 8}, max_ttft_s=30.0)
    result = plan(s, db)
    best = result.configurations[0]
    planned = {row[0]: row for row in _sensitivity(s, result, db)}["as planned"]
    unlimited = _estimate(best, db, prompt_tokens=1024, output_tokens=256, concurrency=32)
    assert planned[1] == seconds(best["ttft_s"]) and best["ttft_s"] > 1.5 * unlimited.ttft_s


def test_a_plan_files_lengths_file_is_read_beside_it(tmp_path, monkeypatch, capsys):
    """As `predict` reads a lengths file beside its CSV, a plan reads one beside the plan file, from any folder."""
    folder = tmp_path / "plans"
    folder.mkdir()
    (folder / "traffic.csv").write_text("prompt,output\n100,50\n900,300\n")
    (folder / "plan.yaml").write_text(yaml.safe_dump({"models": ["llama-3.1-8b"], "workload": {
        "lengths": "traffic.csv", "concurrency": 8}, "constraints": {"gpus": ["l40s"], "max_gpus": 1,
                                                                     "formats": ["fp8"]}}))
    monkeypatch.chdir(tmp_path)   # not the plan's folder
    assert main(["plan", str(folder / "plan.yaml")]) == 0
    assert "(mean 500->175 tokens)" in capsys.readouterr().out
    (folder / "plan.yaml").write_text(yaml.safe_dump({"models": ["llama-3.1-8b"], "workload": {
        "lengths": "elsewhere.csv", "concurrency": 8}}))
    assert main(["plan", str(folder / "plan.yaml")]) == 2
    err = capsys.readouterr().err
    assert "workload.lengths = 'elsewhere.csv'" in err and len(err.strip().splitlines()) == 1
