import pytest

from estimator import units
from estimator.specs.sourced import Quantity


def test_decimal_and_binary_prefixes_are_distinct():
    assert units.GB == 10**9 and units.GiB == 2**30
    assert units.to_base(80, "GiB") == 85_899_345_920
    assert units.to_base(80, "GB") == 80e9


def test_bandwidth_and_throughput_are_decimal():
    assert units.to_base(3.35, "TB/s") == pytest.approx(3.35e12)
    assert units.to_base(989.4, "TFLOPS") == pytest.approx(989.4e12)
    assert units.to_base(1979, "TOPS") == pytest.approx(1.979e15)


def test_unknown_unit_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown unit 'GiB/s'.*TB/s"):
        units.to_base(1, "GiB/s")


def test_quantity_rejects_unknown_unit_and_negative_values():
    with pytest.raises(ValueError, match="unknown unit"):
        Quantity(value=1, unit="gigabytes", source="https://example.com")
    with pytest.raises(ValueError):
        Quantity(value=-1, unit="GB", source="https://example.com")


def test_quantity_checks_its_dimension():
    q = Quantity(value=80, unit="GiB", source="https://example.com")
    assert q.require("bytes", "capacity") is q
    with pytest.raises(ValueError, match="not a bytes_per_s unit"):
        q.require("bytes_per_s", "bandwidth")
