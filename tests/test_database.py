"""Every database entry: schema, sources, and cross-field consistency."""

from __future__ import annotations

from importlib import resources

import pytest
import yaml

from estimator.errors import DatabaseError, UnknownNameError
from estimator.specs.database import load_database, normalize, parse_entry
from estimator.specs.hardware import DeviceClass, Hardware
from estimator.specs.model import ModelSpec
from estimator.units import GiB

DB = load_database()
GPUS = sorted(hw.name for hw in DB.hardware)
MODELS = sorted(m.name for m in DB.models)


def _yaml_files(package):
    return sorted(p.name for p in resources.files(package).iterdir() if p.name.endswith(".yaml"))


def test_database_sizes_meet_the_minimum():
    assert len(GPUS) >= 40
    assert len(MODELS) >= 30


@pytest.mark.parametrize("filename", _yaml_files("hardware_db"))
def test_hardware_file_validates(filename):
    data = yaml.safe_load(resources.files("hardware_db").joinpath(filename).read_text())
    parse_entry(Hardware, data, filename)


@pytest.mark.parametrize("filename", _yaml_files("models_db"))
def test_model_file_validates(filename):
    data = yaml.safe_load(resources.files("models_db").joinpath(filename).read_text())
    parse_entry(ModelSpec, data, filename)


def _quantities(hw: Hardware):
    yield hw.release_year
    yield hw.memory.capacity
    yield hw.memory.bandwidth
    yield from (q for q in (hw.memory.bus_width, hw.memory.data_rate, hw.cache, hw.streaming_multiprocessors,
                            hw.boost_clock) if q is not None)
    yield from hw.dense_peak.values()
    yield from (link.bandwidth for link in (hw.host_link, hw.scale_up_link) if link is not None)
    yield hw.tdp


@pytest.mark.parametrize("name", GPUS)
class TestHardwareEntry:
    def test_every_number_cites_a_url(self, name):
        for q in _quantities(DB.hardware.get(name)):
            assert q.source.startswith("http"), f"{name}: source {q.source!r} is not a URL"

    def test_bandwidth_matches_bus_width_times_data_rate(self, name):
        hw = DB.hardware.get(name)
        derived = hw.memory.derived_bandwidth_bytes_per_s
        if derived is None:
            pytest.skip("bus width or data rate not published")
        assert derived == pytest.approx(hw.memory_bandwidth_bytes_per_s, rel=0.03)

    def test_fp32_peak_matches_sms_times_lanes_times_clock(self, name):
        """FP32 peak = SMs × FP32 lanes per SM × 2 (an FMA) × boost clock, with 64 lanes an SM (Pascal GP100, Volta,
        Turing, Ampere GA100) or 128 (GP102, Ampere GA10x, Ada, Hopper, Blackwell): an SM count or clock slip
        shows as a lane count that is neither."""
        lanes = DB.hardware.get(name).fp32_lanes_per_sm
        if lanes is None:
            pytest.skip("no SM count, clock or FP32 peak recorded")
        assert min(abs(lanes / 64 - 1), abs(lanes / 128 - 1)) < 0.05, f"{name}: {lanes:.1f} FP32 lanes an SM"

    def test_nvidia_gpus_record_their_sm_count(self, name):
        hw = DB.hardware.get(name)
        if hw.vendor != "NVIDIA":
            pytest.skip("streaming multiprocessors are NVIDIA's")
        assert hw.streaming_multiprocessors is not None, f"{name}: no SM count (the per-SM stream bound needs it)"

    def test_peaks_are_ordered_by_precision(self, name):
        peak = DB.hardware.get(name).peak_flops_per_s
        chain = [d for d in ("fp32", "bf16", "fp8", "fp4") if peak(d) is not None]
        for wide, narrow in zip(chain, chain[1:]):
            assert peak(narrow) >= peak(wide) * 0.99, f"{name}: {narrow} peak below {wide}"
        if peak("fp16") and peak("bf16"):
            assert peak("fp16") == pytest.approx(peak("bf16"), rel=0.01)

    def test_has_a_16_or_32_bit_peak(self, name):
        peak = DB.hardware.get(name).peak_flops_per_s
        assert peak("bf16") or peak("fp16") or peak("fp32")

    def test_values_are_physically_plausible(self, name):
        hw = DB.hardware.get(name)
        assert 2016 <= hw.release_year.value <= 2026
        assert 4 * GiB <= hw.memory_capacity_bytes <= 8192 * GiB  # a CPU socket holds up to 6 TiB
        assert 50e9 <= hw.memory_bandwidth_bytes_per_s <= 10e12
        assert 10 <= hw.tdp.value <= 2000
        # a ridge point (16-bit FLOP per byte) outside 5..1000 is a sparse/dense or unit slip
        assert 5 <= hw.ridge_point_flops_per_byte <= 1000

    def test_nvidia_gpus_carry_their_nvml_name(self, name):
        hw = DB.hardware.get(name)
        if hw.vendor != "NVIDIA" or hw.device_class is DeviceClass.soc_unified:
            pytest.skip("NVML names only for NVIDIA discrete GPUs")
        assert any(a.startswith("NVIDIA ") for a in [hw.name, *hw.aliases])


M5_FAMILY = ("Apple M5 (10-core GPU)", "Apple M5 Pro (20-core GPU)", "Apple M5 Max (40-core GPU)")


def test_the_m5_matrix_peak_is_four_times_the_same_cores_fp32_rate():
    """Apple publishes no matrix rate for the M5 GPU cores' Neural Accelerators; hardware_db derives it as four
    times a core's FP32 lanes at the same clock (Apple's "more than four times" the M4's AI compute), so the two
    fields of each chip agree as bus width and data rate do."""
    for name in M5_FAMILY:
        peak = DB.hardware.get(name).peak_flops_per_s
        assert peak("fp16") == pytest.approx(4 * peak("fp32"), rel=0.005), name


def test_a_published_m5_max_prompt_rate_stays_under_the_derived_peak():
    """mlx-lm prefills Llama-3.1-8B 4-bit, 512 tokens, at 3,185 tokens/s on an M5 Max (lablup/mlxcel,
    benchmarks/pylm_m5max_2026-09-06.csv at commit d6538755): 2 x 8.03e9 FLOP a token, 51 TFLOP/s. The derived
    peak must hold it; the FP32 rate the estimate fell back to before would be beaten threefold."""
    hw = DB.hardware.get("Apple M5 Max (40-core GPU)")
    measured_flops_per_s = 2 * 8.03e9 * 3185.37
    assert hw.peak_flops_per_s("fp16") > measured_flops_per_s > 3 * hw.peak_flops_per_s("fp32")


@pytest.mark.parametrize("name", MODELS)
class TestModelEntry:
    def test_sources_are_urls(self, name):
        spec = DB.models.get(name)
        assert spec.config_source.startswith("https://")
        assert spec.published_params.source.startswith("http")

    def test_shapes_are_consistent(self, name):
        s = DB.models.get(name).shape
        assert s.num_attention_heads % s.num_kv_heads == 0
        if s.mla is not None:
            assert s.head_dim == s.mla.qk_nope_head_dim + s.mla.qk_rope_head_dim
        if s.moe is not None:
            assert s.moe.num_dense_layers < s.num_layers


def test_lookup_ignores_case_and_punctuation():
    assert DB.hardware.get("nvidia h100 80gb hbm3").name == DB.hardware.get("H100").name
    assert DB.models.get("META-LLAMA/llama-2-7b-HF").name == "Llama-2-7B"
    assert normalize("NVIDIA A100-SXM4-80GB") == "nvidiaa100sxm480gb"


def test_unknown_name_lists_the_closest_names():
    with pytest.raises(UnknownNameError, match=r"unknown gpu 'H10O'.*Closest:.*H100"):
        DB.hardware.get("H10O")


def test_nvml_names_resolve():
    for nvml in ("NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"):
        assert DB.hardware.get(nvml)


def _write_model(folder, name="My-Model", hf_id="me/my-model"):
    spec = DB.models.get("llama-2-7b").model_dump(mode="json")
    spec.update(name=name, hf_id=hf_id, aliases=[])
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def test_user_folder_adds_entries(tmp_path):
    _write_model(tmp_path)
    db = load_database([tmp_path])
    assert db.models.get("me/my-model").name == "My-Model"
    assert len(db.models) == len(DB.models) + 1


def test_user_folder_from_environment(tmp_path, monkeypatch):
    _write_model(tmp_path, name="Env-Model", hf_id="me/env-model")
    monkeypatch.setenv("ROOFLINE_DB_PATH", str(tmp_path))
    assert load_database().models.get("env-model").hf_id == "me/env-model"


def test_user_entry_replaces_builtin_and_says_so(tmp_path):
    _write_model(tmp_path, name="Llama-2-7B", hf_id="meta-llama/Llama-2-7b-hf")
    db = load_database([tmp_path])
    assert any("Llama-2-7B" in line for line in db.overrides)


def test_misplaced_key_fails_loudly(tmp_path):
    spec = DB.models.get("llama-2-7b").model_dump(mode="json")
    spec.update(name="Typo", hf_id="me/typo", aliases=[])
    spec["shape"]["num_kv_head"] = 8   # typo of num_kv_heads
    (tmp_path / "typo.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(DatabaseError, match="num_kv_head"):
        load_database([tmp_path])


def test_missing_user_folder_is_a_clear_error(tmp_path):
    with pytest.raises(DatabaseError, match="does not exist"):
        load_database([tmp_path / "nope"])


def test_libyaml_reads_every_shipped_file_as_the_python_parser_does():
    """The databases are parsed by libyaml where PyYAML has it (load_yaml): each shipped YAML file must give the
    same document as the pure-Python safe loader, or an estimate would change with how PyYAML was built."""
    from pathlib import Path

    from estimator.errors import load_yaml
    root = Path(__file__).parents[1]
    files = [p for folder in ("hardware_db", "models_db", "engines_db", "estimator")
             for p in (root / folder).rglob("*.yaml")]
    assert len(files) >= 200
    for path in files:
        text = path.read_text()
        assert load_yaml(text) == yaml.safe_load(text), path.name
