"""Device names as people, shops and tools write them resolve to one database entry, or say why not.

Sources of the spellings: marketing names ("NVIDIA B200 SXM 180GB"), NVML (nvidia-smi), rocm-smi, and
macOS system_profiler (SPDisplaysDataType: "Chipset Model: Apple M2 Ultra", "Total Number of Cores: 76").
"""

from __future__ import annotations

import json

import pytest

from estimator.cli import main
from estimator.errors import UnknownNameError
from estimator.specs.database import NameParts, load_database

DB = load_database()

RESOLVES = {
    "NVIDIA B200 SXM 180GB": "NVIDIA B200",
    "NVIDIA H200 NVL 141GB": "NVIDIA H200 NVL",
    "RTX 4090 24GB": "NVIDIA GeForce RTX 4090",
    "GeForce RTX 5060 Ti 16GB": "NVIDIA GeForce RTX 5060 Ti 16GB",
    "AMD Instinct MI300X OAM": "AMD Instinct MI300X",
    # NVML (nvidia-smi --query-gpu=name)
    "NVIDIA GeForce RTX 4090": "NVIDIA GeForce RTX 4090",
    "NVIDIA A100-SXM4-80GB": "NVIDIA A100 SXM4 80GB",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM",
    # rocm-smi --showproductname
    "AMD Instinct MI300X": "AMD Instinct MI300X",
    "AMD Radeon RX 7900 XTX": "AMD Radeon RX 7900 XTX",
    "Radeon RX 7900 XTX": "AMD Radeon RX 7900 XTX",
    # system_profiler: chipset model with its GPU core count
    "Apple M2 Ultra 76-core": "Apple M2 Ultra (76-core GPU)",
    "Apple M2 Ultra (76-core GPU)": "Apple M2 Ultra (76-core GPU)",
    "Apple M2 Ultra, Total Number of Cores: 76": "Apple M2 Ultra (76-core GPU)",
    "Apple M2 Ultra, Total Number of Cores: 60": "Apple M2 Ultra (60-core GPU)",
    "Apple M4 Max 32-core GPU": "Apple M4 Max (32-core GPU)",
    # more qualifiers that agree with the entry
    "NVIDIA H100 SXM5 80GB": "NVIDIA H100 SXM",
    "NVIDIA H100 PCIe 80GB HBM2e": "NVIDIA H100 PCIe 80GB",
    "AMD Radeon RX 7900 XTX 24GB": "AMD Radeon RX 7900 XTX",
    "Intel(R) Arc(TM) B580 Graphics": "Intel Arc B580",
}


@pytest.fixture(scope="module")
def listed():
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["list", "gpus", "--json"]) in (0, None)
    return {g["name"] for g in json.loads(out.getvalue())}


@pytest.mark.parametrize("name, entry", sorted(RESOLVES.items()))
def test_written_names_resolve_to_a_listed_entry(name, entry, listed):
    assert entry in listed
    assert DB.hardware.get(name).name == entry


@pytest.mark.parametrize("name, fits", [
    ("A100 80GB", ["NVIDIA A100 PCIe 80GB", "NVIDIA A100 SXM4 80GB"]),
    ("NVIDIA H100 80GB", ["NVIDIA H100 PCIe 80GB", "NVIDIA H100 SXM"]),
    ("Apple M2 Ultra 192GB", ["Apple M2 Ultra (60-core GPU)", "Apple M2 Ultra (76-core GPU)"]),
])
def test_an_ambiguous_name_lists_the_candidates_and_picks_none(name, fits):
    with pytest.raises(UnknownNameError, match="is ambiguous") as error:
        DB.hardware.get(name)
    assert all(f in str(error.value) for f in fits)


@pytest.mark.parametrize("name, said", [
    ("RTX 4090 48GB", "48 GB"),
    ("Apple M2 Ultra 80-core", "80-core GPU"),
    ("NVIDIA B200 PCIe", "pcie"),
    ("NVIDIA GeForce RTX 4090 HBM3", "hbm3"),
])
def test_a_qualifier_that_disagrees_is_an_error_naming_it(name, said):
    with pytest.raises(UnknownNameError, match=f"disagrees with .*{said}"):
        DB.hardware.get(name)


def test_a_different_product_is_not_matched_by_dropping_words():
    with pytest.raises(UnknownNameError, match="unknown gpu"):
        DB.hardware.get("NVIDIA GeForce RTX 4090 Ti")


def test_model_names_stay_exact():
    with pytest.raises(UnknownNameError, match="unknown model"):
        DB.models.get("NVIDIA Llama-2-7B")


def test_name_parts_split_qualifiers_off():
    parts = NameParts.of("NVIDIA A100-SXM4-80GB")
    assert (parts.key, parts.sizes, parts.forms) == ("a100", {80.0}, {"sxm"})
    parts = NameParts.of("Apple M2 Ultra, Total Number of Cores: 76")
    assert (parts.key, parts.cores) == ("m2ultra", {76})
    assert NameParts.of("NVIDIA GB200 186GB").key == "gb200"
