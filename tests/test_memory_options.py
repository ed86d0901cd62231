"""Memory sizes sold per device (``memory.options``) and `--memory-gib`.

An Apple chip sold with several memory sizes records them all; the estimate assumes the largest (the
entry's capacity) and says so, and `--memory-gib` picks another. A device without options accepts
`--memory-gib` only when it repeats the one size recorded (a no-op), and refuses any other size,
so that a flag is never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from estimator.errors import ConfigurationError, DatabaseError
from estimator.evaluation.api import estimate, resolve_calibrated_hardware, resolve_hardware
from estimator.specs.database import load_database
from estimator.specs.hardware import Memory
from estimator.units import GiB
from tests.helpers import cli

# The entries given options (docs: hardware_db FIXES section 2, sizes verified in the cited source).
EXPECTED_OPTIONS = {
    "Apple M1 (7-core GPU)": (8, 16),
    "Apple M1 Max (24-core GPU)": (32, 64),
    "Apple M1 Max (32-core GPU)": (32, 64),
    "Apple M1 Pro (14-core GPU)": (16, 32),
    "Apple M1 Pro (16-core GPU)": (16, 32),
    "Apple M1 Ultra (48-core GPU)": (64, 128),
    "Apple M1 Ultra (64-core GPU)": (64, 128),
    "Apple M1 (8-core GPU)": (8, 16),
    "Apple M2 (8-core GPU)": (8, 16, 24),
    "Apple M2 (10-core GPU)": (8, 16, 24),
    "Apple M2 Max (30-core GPU)": (32, 64),
    "Apple M2 Max (38-core GPU)": (32, 64, 96),
    "Apple M2 Pro (16-core GPU)": (16, 32),
    "Apple M2 Pro (19-core GPU)": (16, 32),
    "Apple M2 Ultra (60-core GPU)": (64, 128, 192),
    "Apple M2 Ultra (76-core GPU)": (64, 128, 192),
    "Apple M3 (10-core GPU)": (8, 16, 24),
    "Apple M3 Max (30-core GPU)": (36, 96),
    "Apple M3 Max (40-core GPU)": (48, 64, 128),
    "Apple M3 Pro (14-core GPU)": (18, 36),
    "Apple M3 Pro (18-core GPU)": (18, 36),
    "Apple M3 Ultra (60-core GPU)": (96, 256),
    "Apple M3 Ultra (80-core GPU)": (96, 256, 512),
    "Apple M4 (10-core GPU)": (8, 16, 24, 32),
    "Apple M4 Max (40-core GPU)": (48, 64, 128),
    "Apple M4 Pro (16-core GPU)": (24, 48, 64),
    "Apple M4 Pro (20-core GPU)": (24, 48, 64),
    "Apple M5 (10-core GPU)": (16, 24, 32),
    "Apple M5 Max (40-core GPU)": (48, 64, 128),
}
SOURCE = "https://example.com/spec-sheet"



def memory(capacity_gib=64, options=(16, 32, 64), unit="GiB"):
    data = {"type": "LPDDR5X", "capacity": {"value": capacity_gib, "unit": "GiB", "source": SOURCE},
            "bandwidth": {"value": 273, "unit": "GB/s", "source": SOURCE}}
    if options is not None:
        data["options"] = {"value": list(options), "unit": unit, "source": SOURCE, "note": "verified"}
    return data


# ---------------------------------------------------------------- schema and data


def test_the_recorded_options_load_and_the_capacity_is_the_largest(db):
    for name, sizes in EXPECTED_OPTIONS.items():
        hw = db.hardware.get(name)
        assert hw.memory_options_gib == sizes, name
        assert hw.memory_capacity_bytes == sizes[-1] * GiB, name
        assert "verified" in hw.memory.options.note, name
    with_options = {hw.name for hw in db.hardware if hw.memory.options is not None}
    assert with_options == set(EXPECTED_OPTIONS)   # only where the sizes were verified


def test_a_valid_options_field():
    m = Memory.model_validate(memory())
    assert m.options.base == (16 * GiB, 32 * GiB, 64 * GiB)
    assert Memory.model_validate(memory(options=None)).options is None


@pytest.mark.parametrize("data, complaint", [
    (memory(capacity_gib=32), "is not the largest of memory.options"),
    (memory(capacity_gib=128), "is not the largest of memory.options"),
    (memory(options=(64, 32, 16)), "ascending"),
    (memory(options=(16, 16, 64)), "ascending"),
    (memory(options=(0, 64)), "greater than 0"),
    (memory(options=(64,)), "at least 2"),
    (memory(unit="GB/s"), "not a bytes unit"),
    (memory(unit="parsecs"), "not a bytes unit"),
])
def test_invalid_options_are_refused(data, complaint):
    with pytest.raises(ValidationError, match=complaint):
        Memory.model_validate(data)


def test_options_without_a_source_are_refused():
    data = memory()
    del data["options"]["source"]
    with pytest.raises(ValidationError, match="source"):
        Memory.model_validate(data)


def test_a_user_entry_whose_capacity_is_not_the_largest_option_is_a_database_error(tmp_path, db):
    text = tmp_path / "x.yaml"
    base = db.hardware.origins["Apple M4 Pro (20-core GPU)"]
    entry = Path(base).read_text(encoding="utf-8").replace("name: Apple M4 Pro (20-core GPU)", "name: Test Chip") \
        .replace('aliases: ["Apple M4 Pro", "M4 Pro", "M4 Pro 20-core GPU"]', "aliases: []") \
        .replace("value: [24, 48, 64]", "value: [24, 48]")
    text.write_text(entry, encoding="utf-8")
    with pytest.raises(DatabaseError, match="not the largest of memory.options"):
        load_database([str(tmp_path)])


# ---------------------------------------------------------------- choosing a size


def test_with_memory_gib_replaces_only_the_capacity(db):
    hw = db.hardware.get("M4 Max")
    smaller = hw.with_memory_gib(64)
    assert smaller.memory_capacity_bytes == 64 * GiB
    assert smaller.memory_options_gib == (48, 64, 128) and smaller.name == hw.name
    assert smaller.memory.bandwidth == hw.memory.bandwidth and smaller.dense_peak == hw.dense_peak
    assert smaller.memory.capacity.source == hw.memory.options.source
    assert hw.memory_capacity_bytes == 128 * GiB          # the entry itself is unchanged
    assert hw.with_memory_gib(128) is hw and hw.with_memory_gib(128.0) is hw


def test_a_size_not_sold_is_an_error_naming_the_sizes(db):
    hw = db.hardware.get("M4 Max")
    with pytest.raises(ConfigurationError, match=r"not sold with 96 GiB.*48, 64 or 128 GiB"):
        hw.with_memory_gib(96)


def test_a_device_without_options_accepts_only_its_one_size(db):
    h100 = db.hardware.get("H100 SXM")
    assert h100.memory_options_gib is None
    assert h100.with_memory_gib(80) is h100
    with pytest.raises(ConfigurationError, match=r"not sold with 40 GiB.*one size, 80 GiB"):
        h100.with_memory_gib(40)


def test_resolvers_pass_the_size_through(db):
    assert resolve_hardware("M4 Pro", db, memory_gib=24).memory_capacity_bytes == 24 * GiB
    assert resolve_hardware("M4 Pro", db).memory_capacity_bytes == 64 * GiB
    device, profile = resolve_calibrated_hardware("M4 Pro", None, db, memory_gib=48)
    assert device.memory_capacity_bytes == 48 * GiB and profile is None


def test_the_api_estimate_of_a_chosen_device(db):
    hw = db.hardware.get("M4 Max")
    big, small = (estimate("llama-3.1-70b", d, weight_format="int4-awq", db=db) for d in (hw, hw.with_memory_gib(48)))
    assert small.memory_available_bytes < big.memory_available_bytes
    assert big.fits and not small.fits


# ---------------------------------------------------------------- the command line


def test_the_default_is_the_largest_and_the_report_says_so(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "M4 Max")
    assert code == 0
    assert "Apple M4 Max (40-core GPU) with 128 GiB (the largest sold; --memory-gib 48|64|128)" in out


def test_a_device_without_options_prints_no_memory_line(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "H100")
    assert code == 0 and "--memory-gib" not in out and "largest sold" not in out


def test_memory_gib_changes_the_available_memory_and_the_fit(capsys):
    args = ("estimate", "--model", "llama-3.1-70b", "--gpu", "M4 Max", "--format", "int4-awq", "--json")
    runs = {}
    for size in (None, "64", "48"):
        code, out, _ = cli(capsys, *args, *(("--memory-gib", size) if size else ()))
        assert code == 0
        runs[size] = json.loads(out)
    assert runs[None]["memory_gib"] == 128 and runs["64"]["memory_gib"] == 64 and runs["48"]["memory_gib"] == 48
    assert all(r["memory_options_gib"] == [48, 64, 128] for r in runs.values())
    available = [runs[k]["memory_available_bytes"] for k in (None, "64", "48")]
    assert available[0] > available[1] > available[2]
    assert runs[None]["memory_required_bytes"] == runs["48"]["memory_required_bytes"]
    assert runs[None]["fits"] and runs["64"]["fits"] and not runs["48"]["fits"]
    code, out, _ = cli(capsys, *args[:-1], "--memory-gib", "64")
    assert "Apple M4 Max (40-core GPU) with 64 GiB (chosen; --memory-gib 48|64|128)" in out
    assert "64 GiB LPDDR5X memory" in out


def test_json_of_a_device_without_options(capsys):
    code, out, _ = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "H100", "--json")
    data = json.loads(out)
    assert code == 0 and data["memory_gib"] == 80 and data["memory_options_gib"] is None


def test_a_size_not_sold_exits_2_with_one_line(capsys):
    code, out, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "M4 Max", "--memory-gib", "96")
    assert code == 2 and out == ""
    assert err.count("\n") == 1
    assert "96 GiB" in err and "48, 64 or 128 GiB" in err and "Apple M4 Max (40-core GPU)" in err


def test_a_device_without_options_refuses_another_size_and_accepts_its_own(capsys):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "H100", "--memory-gib", "96")
    assert code == 2 and "96 GiB" in err and "80 GiB" in err and err.count("\n") == 1
    same = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "H100", "--memory-gib", "80", "--json")
    plain = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "H100", "--json")
    assert same[0] == 0 and json.loads(same[1]) == json.loads(plain[1])


@pytest.mark.parametrize("value", ["0", "-8", "nan", "inf", "lots"])
def test_a_malformed_memory_gib_is_refused_by_the_parser(capsys, value):
    code, _, err = cli(capsys, "estimate", "--model", "llama-3.1-8b", "--gpu", "M4 Max", "--memory-gib", value)
    assert code == 2 and "--memory-gib" in err


def test_explain_and_disaggregation_use_the_chosen_size(capsys):
    code, out, _ = cli(capsys, "explain", "--model", "llama-3.1-70b", "--gpu", "M4 Max", "--format", "int4-awq",
                       "--memory-gib", "48")
    assert code == 0 and "does not fit" in out
    disaggregated = ("estimate", "--model", "llama-3.1-70b", "--gpu", "M4 Max", "--format", "int4-awq", "--rate", "0.1",
                     "--prefill-gpus", "1", "--decode-gpus", "1", "--json")
    small = cli(capsys, *disaggregated, "--memory-gib", "48")
    large = cli(capsys, *disaggregated)
    assert small[0] == large[0] == 0
    assert json.loads(small[1])["aggregated"]["saturated"] and not json.loads(large[1])["aggregated"]["saturated"]


def test_a_predict_row_is_evaluated_with_its_machines_memory():
    """xiongjiedai's M1 MacBook Air had 8 GB (the 7-core chip is also sold with 16 GB): its row says so."""
    from estimator.validation.predict import predict_rows

    row = {"id": "m1", "hardware": "Apple M1 (7-core GPU)", "n_gpus": "1", "model": "llama-3.1-8b",
           "weight_format": "Q8_0", "batch": "1", "input_len": "512", "output_len": "128", "metric": "itl_ms"}
    largest, eight, wrong = predict_rows([row, {**row, "memory_gib": "8"}, {**row, "memory_gib": "12"}])
    assert largest["status"] == "ok" and eight["status"] == "does_not_fit"   # 8.5 GB of Q8_0 weights
    assert wrong["status"] == "invalid" and "12 GiB" in wrong["reason"] and "8 or 16 GiB" in wrong["reason"]
