"""Plan targets at a latency percentile of the queueing model, and the report's percentile-vs-load plot."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from estimator.cli import main
from estimator.errors import ConfigurationError
from estimator.evaluation.api import estimate
from estimator.planning.search import plan
from estimator.planning.spec import DevicePrice, PlanSpec, Prices, load_plan

CLOUD = {"NVIDIA H100 SXM": DevicePrice(cloud_usd_per_hour=3.0), "NVIDIA GeForce RTX 4090": DevicePrice(
    cloud_usd_per_hour=0.7), "NVIDIA L40S": DevicePrice(cloud_usd_per_hour=1.3),
    "NVIDIA A100 SXM4 80GB": DevicePrice(cloud_usd_per_hour=1.8)}
TARGETS = {"max_ttft_s": 0.5, "min_tps_per_user": 20}


def spec(latency_percentile=None, targets=TARGETS, workload=None, **changes) -> PlanSpec:
    base = {"models": ["llama-3.1-8b"], "workload": workload or {"prompt": 1024, "output": 256, "concurrency": 32},
            "targets": {**targets, "latency_percentile": latency_percentile},
            "constraints": {"gpus": ["h100", "rtx 4090", "l40s", "a100"], "max_gpus": 4},
            "prices": Prices(devices=CLOUD)}
    base.update(changes)
    return PlanSpec.model_validate(base)


def _key(c: dict) -> tuple:
    return c["hardware"], c["count"], c["tp"], c["format"]


@pytest.fixture(scope="module")
def plans(db):
    return {level: plan(spec(level), db) for level in (None, "p50", "p90", "p99")}


def test_a_higher_percentile_never_chooses_a_cheaper_configuration(plans):
    chosen = {level: plans[level].configurations for level in ("p50", "p90", "p99")}
    assert all(chosen.values())
    for lower, higher in (("p50", "p90"), ("p90", "p99")):
        # every candidate meeting the targets at the higher percentile meets them at the lower one
        assert {_key(c) for c in chosen[higher]} <= {_key(c) for c in chosen[lower]}
        assert chosen[higher][0]["cost_per_million_tokens_usd"] >= chosen[lower][0]["cost_per_million_tokens_usd"]
    # the p99 tail is strictly more demanding here: some candidates good at p50 fail at p99, and the
    # cheapest at p99 needs more devices than one RTX 4090
    assert len(chosen["p99"]) < len(chosen["p50"])
    assert chosen["p99"][0]["count"] >= chosen["p50"][0]["count"]
    assert chosen["p99"][0]["cost_per_million_tokens_usd"] > chosen["p50"][0]["cost_per_million_tokens_usd"]
    assert any(r["reason"].startswith("TTFT p99 too high") or "(1 / ITL p99)" in r["reason"]
               for r in plans["p99"].rejected)


def test_the_chosen_configurations_meet_the_targets_at_p99(plans, db):
    result = plans["p99"]
    for c in result.configurations:
        assert c["latency_percentile"] == "p99"
        assert c["ttft_p99_s"] <= TARGETS["max_ttft_s"] and 1 / c["itl_p99_s"] >= TARGETS["min_tps_per_user"]
        assert c["ttft_p99_s"] >= c["ttft_s"] * 0.999   # the tail is above the mean here
    best = result.configurations[0]
    # the public API at the plan's load agrees with what the planner judged
    e = estimate(best["model"], best["hardware"], n_gpus=best["count"], tp=best["tp"], weight_format=best["format"],
                 prompt_tokens=1024, output_tokens=256, concurrency=32, engine="vLLM", calibration=None, db=db)
    assert e.ttft_p99_s == pytest.approx(best["ttft_p99_s"], rel=1e-6) and e.ttft_p99_s <= TARGETS["max_ttft_s"]
    assert e.itl_p99_s == pytest.approx(best["itl_p99_s"], rel=1e-6)
    # something that meets the targets on the means fails them at p99
    means = {_key(c) for c in plans[None].configurations}
    assert means - {_key(c) for c in result.configurations}


def test_plan_without_a_percentile_judges_the_means(plans):
    for c in plans[None].configurations:
        assert c["latency_percentile"] is None and "ttft_p99_s" not in c
        assert c["ttft_s"] <= TARGETS["max_ttft_s"] and c["decode_tps_per_seq"] >= TARGETS["min_tps_per_user"]


def test_interval_end_and_latency_percentile_combine(db):
    both = plan(spec("p90", targets={**TARGETS, "percentile": "p90"}), db)
    p90 = plan(spec("p90"), db)
    assert {_key(c) for c in both.configurations} <= {_key(c) for c in p90.configurations}
    for c in both.configurations:   # the pessimistic interval end applied to the percentile
        match = next(o for o in p90.configurations if _key(o) == _key(c))
        assert c["ttft_p90_s"] >= match["ttft_p90_s"] and c["itl_p90_s"] >= match["itl_p90_s"]


def test_latency_percentile_without_a_load_is_refused(capsys):
    code = main(["plan", "--model", "llama-3.1-8b", "--prompt", "512", "--output", "128", "--latency-percentile",
                 "p99", "--max-ttft-s", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err and "Error" not in err
    assert "--latency-percentile" in err and "--concurrency" in err and "--rate" in err


def test_latency_percentile_flag_is_checked(capsys):
    code = main(["plan", "--model", "llama-3.1-8b", "--prompt", "512", "--output", "128", "--concurrency", "4",
                 "--latency-percentile", "p95"])
    err = capsys.readouterr().err
    assert code == 2 and "--latency-percentile" in err and "p99" in err and len(err.splitlines()) == 1


def test_cli_flag_prints_the_percentile_and_its_latencies(capsys):
    code = main(["plan", "--model", "llama-3.1-8b", "--prompt", "1024", "--output", "256", "--concurrency", "32",
                 "--max-ttft-s", "0.5", "--min-tps-per-user", "20", "--gpus", "h100", "--max-gpus", "2",
                 "--latency-percentile", "p99"])
    out = capsys.readouterr().out
    assert code == 0
    assert "TTFT p99 and 1/ITL p99 under the load" in out.splitlines()[0]
    header = next(line for line in out.splitlines() if "hardware" in line)
    assert "TTFT p99" in header and "ITL p99" in header


def _plan_file(tmp_path, **targets):
    data = spec().model_dump(mode="json", exclude_none=True)
    data["targets"] = {**TARGETS, **targets}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_file_with_targets_latency_percentile(tmp_path, capsys, plans):
    path = _plan_file(tmp_path, latency_percentile="p99")
    assert load_plan(path).targets.latency_percentile == "p99"
    assert main(["plan", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [_key(c) for c in data["configurations"]] == [_key(c) for c in plans["p99"].configurations]
    assert all(c["latency_percentile"] == "p99" and c["ttft_p99_s"] <= 0.5 for c in data["configurations"])
    path.write_text(path.read_text().replace("latency_percentile: p99", "latency_percentile: p95"))
    with pytest.raises(ConfigurationError, match="targets.latency_percentile"):
        load_plan(path)
    assert main(["plan", str(path), "--latency-percentile", "p50"]) == 2   # flags never mix with a file
    assert "--latency-percentile" in capsys.readouterr().err


def test_report_plots_percentiles_against_load_without_saturated_points(db, monkeypatch):
    from estimator.reporting import procurement
    # open loop up to 1.5 x the highest sustainable rate: the last loads saturate and must be left out
    monkeypatch.setattr(procurement, "RATE_SHARES", (0.1, 0.5, 0.9, 1.2, 1.5))
    s = spec("p99", targets={"max_ttft_s": 2.0}, workload={"prompt": 1024, "output": 256, "rate": 2.0},
             constraints={"gpus": ["l40s"], "max_gpus": 1, "formats": ["fp8"]})
    best = plan(s, db).configurations[0]
    data = procurement.percentiles_against_load(s, best, db)
    kwargs = {"n_gpus": best["count"], "tp": best["tp"], "weight_format": best["format"], "prompt_tokens": 1024,
              "output_tokens": 256, "engine": "vLLM", "calibration": None, "db": db}
    top = estimate(best["model"], best["hardware"], rate=2.0, **kwargs).max_rate
    assert estimate(best["model"], best["hardware"], rate=1.5 * top, **kwargs).saturated
    assert data["load"] == "rate" and 2.0 in data["x"] and max(data["x"]) < top
    assert len(data["x"]) >= 3 and data["x"] == sorted(data["x"])
    assert set(data["series"]) == {f"{k} {p}" for k in ("TTFT", "ITL") for p in ("p50", "p90", "p99")}
    for name, values in data["series"].items():
        assert len(values) == len(data["x"]) and all(math.isfinite(v) and v > 0 for v in values), name
    for x in data["x"]:
        assert not estimate(best["model"], best["hardware"], rate=x, **kwargs).saturated
    for kind in ("TTFT", "ITL"):   # percentiles ordered at every load
        for p50, p90, p99 in zip(*(data["series"][f"{kind} {p}"] for p in ("p50", "p90", "p99"))):
            assert p50 <= p90 * (1 + 1e-9) and p90 <= p99 * (1 + 1e-9)


def test_report_contains_the_percentile_plot(tmp_path, plans, db):
    from estimator.reporting.procurement import build_context, write_report
    out = tmp_path / "report.html"
    write_report(str(_plan_file(tmp_path, latency_percentile="p99")), str(out))
    html = out.read_text()
    assert out.exists() and len(re.findall(r'src="data:image/png;base64,', html)) == 6
    assert "50th, 90th and 99th percentiles of the queueing model" in html and "judged on the p99 latencies" in html
    assert "<th>TTFT p99</th>" in html   # the shortlist and sensitivity tables show what the targets judged
    context = build_context(plans["p99"].spec, plans["p99"], db, "plan.yaml")
    figure = next(f for f in context["figures"] if "data" in f)
    data = figure["data"]
    assert data["load"] == "concurrency" and data["x"][0] == 1 and 32 in data["x"]
    assert all(math.isfinite(v) for values in data["series"].values() for v in values)
    planned = next(row for row in context["sensitivity"] if row[0] == "as planned")
    assert planned[-1] == "yes"   # the report judges the recommendation as the plan did


def test_a_single_clients_speed_is_judged_at_the_batch_one_band(db):
    """At the interval's pessimistic end a plan judges TTFT at the serving band, and one client's per-user speed at
    the band its decode takes (intervals.band_regime): a batch of one's cells, not the serving band of any load."""
    from estimator.evaluation.intervals import pessimistic_ratios
    from estimator.specs.formats import format_family
    one = {"prompt": 1024, "output": 256, "concurrency": 1}
    means = plan(spec(workload=one), db)
    pessimistic = plan(spec(workload=one, targets={**TARGETS, "percentile": "p90"}), db)
    checked = 0
    for c in pessimistic.configurations:
        match = next((o for o in means.configurations if _key(o) == _key(c)), None)
        if match is None:
            continue
        hw = db.hardware.get(c["hardware"])
        args = (False, format_family(c["format"]), pessimistic.spec.engine, hw.vendor, hw.device_class.value)
        ttft_low, speed_low = pessimistic_ratios(*args, True)
        assert speed_low != pessimistic_ratios(*args, False)[1]
        assert math.isclose(c["decode_tps_per_seq"], match["decode_tps_per_seq"] * speed_low, rel_tol=1e-9)
        assert math.isclose(c["ttft_s"], match["ttft_s"] / ttft_low, rel_tol=1e-9)
        checked += 1
    assert checked
