"""The planner on hand-checkable cases, plan files, and the procurement report."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from estimator.cli import main
from estimator.errors import ConfigurationError
from estimator.planning.search import plan
from estimator.planning.spec import DevicePrice, PlanSpec, Prices, load_plan

CLOUD = {"NVIDIA H100 SXM": DevicePrice(cloud_usd_per_hour=3.0), "NVIDIA GeForce RTX 4090": DevicePrice(
    cloud_usd_per_hour=0.7), "NVIDIA L40S": DevicePrice(cloud_usd_per_hour=1.3),
    "NVIDIA A100 SXM4 80GB": DevicePrice(cloud_usd_per_hour=1.8)}


def spec(**changes) -> PlanSpec:
    base = dict(models=["llama-3.1-8b"], workload={"prompt": 1024, "output": 256, "concurrency": 8},
                targets={"max_ttft_s": 2.0, "min_tps_per_user": 20},
                constraints={"gpus": ["h100", "rtx 4090", "l40s", "a100"], "max_gpus": 4},
                prices=Prices(devices=CLOUD))
    base.update(changes)
    return PlanSpec.model_validate(base)


def test_results_meet_targets_and_are_cheapest_first(db):
    result = plan(spec(), db)
    costs = [c["cost_per_million_tokens_usd"] for c in result.configurations]
    assert costs and costs == sorted(costs)
    for c in result.configurations:
        assert c["ttft_s"] <= 2.0 and c["decode_tps_per_seq"] >= 20 and c["meets_targets"]
    assert any(c["pareto"] for c in result.configurations)
    assert all(r["reason"] for r in result.rejected)


def test_cost_per_million_tokens_by_hand(db):
    c = plan(spec(), db).configurations[0]
    assert c["cost_per_million_tokens_usd"] == pytest.approx(
        c["count"] * CLOUD[c["hardware"]].cloud_usd_per_hour / (c["throughput_out_tps"] * 3600) * 1e6)


def test_a_model_for_80_gb_cards_never_lands_on_a_24_gb_card(db):
    """Qwen3-32B in FP8 (33 GB of weights) runs on one H100 under vLLM, not on a 24 GB RTX 4090. (Llama-3.1-70B in
    FP8 fits neither: beside its 72.7 GB of weights vLLM keeps 5.1 GB for its sampler warm-up, and its own logs
    report no room for a cache on one H100, docs/formulas.md §3.)"""
    result = plan(spec(models=["qwen3-32b"], targets={"min_tps_per_user": 5},
                       constraints={"gpus": ["h100", "rtx 4090"], "max_gpus": 1, "formats": ["fp8"]}), db)
    assert result.configurations and all(c["hardware"] == "NVIDIA H100 SXM" for c in result.configurations)
    assert any(r["hardware"] == "NVIDIA GeForce RTX 4090" and r["reason"].startswith("does not fit")
               for r in result.rejected)


def test_mla_models_are_also_planned_with_attention_data_parallel(db):
    """DeepSeek's latent is copied onto every TP rank: the same devices with attention DP and expert
    parallelism are a candidate beside plain TP, and under a heavy load, holding more sequences, they serve
    more per device; a model with enough KV heads gets no such candidate."""
    heavy = spec(models=["deepseek-v3"], workload={"prompt": 1000, "output": 1000, "concurrency": 256},
                 targets={"max_ttft_s": 5.0, "min_tps_per_user": 10},
                 constraints={"gpus": ["h200"], "max_gpus": 8, "formats": ["fp8"]},
                 prices=Prices(devices={"NVIDIA H200 SXM 141GB": DevicePrice(cloud_usd_per_hour=4.0)}))
    found = plan(heavy, db).configurations
    by_layout = {(c["count"], c["attention_dp"]): c for c in found}
    dep, tp = by_layout[8, True], by_layout[8, False]
    assert dep["ep"] == 8 and "attention-dp" in dep["layout"]
    assert dep["throughput_out_tps"] > tp["throughput_out_tps"]
    assert not any(c["attention_dp"] for c in plan(spec(), db).configurations)   # Llama-3.1-8B: 8 KV heads


def test_doubling_the_winners_price_changes_the_winner(db):
    first = plan(spec(), db).configurations[0]
    prices = dict(CLOUD)
    prices[first["hardware"]] = DevicePrice(cloud_usd_per_hour=2 * CLOUD[first["hardware"]].cloud_usd_per_hour)
    second = plan(spec(prices=Prices(devices=prices)), db).configurations[0]
    assert second["hardware"] != first["hardware"]


def test_impossible_targets_give_the_closest_miss(db):
    result = plan(spec(targets={"max_ttft_s": 0.001, "min_tps_per_user": 5000}), db)
    assert not result.configurations and result.closest_miss is not None
    assert "TTFT too high" in result.closest_miss["reason"]


def test_fp4_only_where_the_device_has_it(db):
    result = plan(spec(constraints={"gpus": ["h100"], "max_gpus": 1, "formats": ["nvfp4"]}), db)
    assert not result.configurations and result.rejected[0]["reason"].startswith("no FP4 tensor cores")


def test_plan_file_with_an_unknown_key_names_it(tmp_path):
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({"models": ["llama-3.1-8b"], "workload": {"prompt": 10, "output": 10,
                                                                            "concurrency": 1, "colour": "red"}}))
    with pytest.raises(ConfigurationError, match="workload.colour"):
        load_plan(path)
    path.write_text(yaml.safe_dump({"models": ["llama-3.1-8b"], "workload": {"prompt": 10, "output": 10}}))
    with pytest.raises(ConfigurationError, match="exactly one of workload.concurrency and workload.rate"):
        load_plan(path)


def _plan_file(tmp_path):
    path = tmp_path / "plan.yaml"
    data = spec().model_dump(mode="json", exclude_none=True)
    path.write_text(yaml.safe_dump(data))
    return path


def test_cli_plan_json_has_the_documented_keys(tmp_path, capsys):
    assert main(["plan", str(_plan_file(tmp_path)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    first = data["configurations"][0]
    for key in ("hardware", "count", "tp", "format", "batch", "ttft_s", "decode_tps_per_seq",
                "cost_per_million_tokens_usd", "meets_targets"):
        assert key in first
    assert all("reason" in r for r in data["rejected"])


def test_cli_plan_from_flags(capsys):
    code = main(["plan", "--model", "llama-3.1-8b", "--prompt", "512", "--output", "128", "--concurrency", "4",
                 "--gpus", "h100", "--max-gpus", "2"])
    out = capsys.readouterr().out
    assert code == 0 and "Rejected" in out


def test_report_is_self_contained_html_with_every_section(tmp_path):
    from estimator.reporting.procurement import write_report
    out = tmp_path / "report.html"
    write_report(str(_plan_file(tmp_path)), str(out))
    html = out.read_text()
    for section in ("requirements", "recommendation", "shortlist", "plots", "sensitivity", "assumptions",
                    "accuracy"):
        assert f'id="{section}"' in html
    assert len(re.findall(r'src="data:image/png;base64,', html)) == 6   # with the percentiles against load
    assert not re.search(r'<(script|link)[^>]+(src|href)="http', html)   # nothing fetched from the network
    with pytest.raises(ConfigurationError, match="--force"):
        write_report(str(_plan_file(tmp_path)), str(out))


def test_report_markdown(tmp_path):
    from estimator.reporting.procurement import write_report
    out = tmp_path / "report.md"
    write_report(str(_plan_file(tmp_path)), str(out), fmt="md")
    text = out.read_text()
    assert text.startswith("# Inference hardware plan") and "## Sensitivity" in text and "data:image/png" in text
