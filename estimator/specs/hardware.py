"""Hardware specs: one YAML file per device in ``hardware_db/``, validated on load.

The YAML keeps datasheet numbers as published (value, unit, source); the
properties below convert them to base units once, for the arrays the timing
code works on. Peak throughputs are **dense** (never the with-sparsity figure)
and, for GeForce cards, the tensor rate with FP32 accumulation, which is what
PyTorch and inference kernels use (docs/formulas.md §4, §12.5).
"""

from __future__ import annotations

import math
from enum import Enum

from pydantic import Field, field_validator, model_validator

from estimator.errors import ConfigurationError
from estimator.specs.sourced import Frozen, Quantity
from estimator.units import BITS_PER_BYTE, UNIT_DIMENSIONS, UNIT_FACTORS, GiB, to_base

# Data types a peak throughput may be given for, narrowest last.
COMPUTE_DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8", "fp6", "fp4", "int4")


class DeviceClass(str, Enum):
    datacenter_gpu = "datacenter_gpu"
    workstation_gpu = "workstation_gpu"
    consumer_gpu = "consumer_gpu"
    soc_unified = "soc_unified"
    accelerator = "accelerator"   # non-GPU AI accelerators such as Intel Gaudi
    cpu = "cpu"


class MemoryType(str, Enum):
    HBM2 = "HBM2"
    HBM2e = "HBM2e"
    HBM3 = "HBM3"
    HBM3e = "HBM3e"
    GDDR5 = "GDDR5"
    GDDR5X = "GDDR5X"
    GDDR6 = "GDDR6"
    GDDR6X = "GDDR6X"
    GDDR7 = "GDDR7"
    LPDDR4X = "LPDDR4X"
    LPDDR5 = "LPDDR5"
    LPDDR5X = "LPDDR5X"
    DDR4 = "DDR4"
    DDR5 = "DDR5"
    MRDIMM = "MRDIMM"
    unknown = "unknown"   # only for devices built from a calibration profile


class MemoryOptions(Frozen):
    """The memory capacities one device is sold with, smallest first, from one source.

    Like a :class:`Quantity` (value, unit, source, note), with a list of values:
    ``{value: [48, 64, 128], unit: GiB, source: ..., note: ...}``.
    """

    value: list[float] = Field(min_length=2, description="capacities sold, ascending; a single size is just capacity")
    unit: str
    source: str = Field(min_length=8, description="URL (or document and page) the sizes are taken from")
    note: str | None = Field(default=None, description="which configurations, and how the sizes were verified")

    @field_validator("unit")
    @classmethod
    def _bytes_unit(cls, unit: str) -> str:
        if UNIT_DIMENSIONS.get(unit) != "bytes":
            raise ValueError(f"unit {unit!r} is not a bytes unit; use one of: "
                             f"{', '.join(u for u in UNIT_FACTORS if UNIT_DIMENSIONS[u] == 'bytes')}")
        return unit

    @field_validator("value")
    @classmethod
    def _ascending(cls, value: list[float]) -> list[float]:
        if any(v <= 0 for v in value):
            raise ValueError(f"every size must be greater than 0, got {value}")
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError(f"sizes must be distinct and ascending, got {value}")
        return value

    @property
    def base(self) -> tuple[float, ...]:
        """The sizes in bytes."""
        return tuple(to_base(v, self.unit) for v in self.value)


def _sizes_text(sizes_gib) -> str:
    """'48, 64 or 128 GiB'."""
    shown = [f"{s:g}" for s in sizes_gib]
    return (f"{', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else shown[0]) + " GiB"


class Memory(Frozen):
    """Main memory of one device (for a CPU: one socket)."""

    type: MemoryType
    capacity: Quantity = Field(description="the largest size sold, where memory.options lists several")
    bandwidth: Quantity = Field(description="peak, per device")
    bus_width: Quantity | None = Field(default=None, description="bits")
    data_rate: Quantity | None = Field(default=None, description="per pin, Gbps or MT/s")
    options: MemoryOptions | None = Field(default=None, description="every capacity sold (Apple chips); the "
                                          "estimate assumes the largest unless one is chosen (--memory-gib)")

    @model_validator(mode="after")
    def _units_and_consistency(self) -> "Memory":
        self.capacity.require("bytes", "memory.capacity", positive=True)
        if self.options is not None and not math.isclose(self.options.base[-1], self.capacity.base, rel_tol=1e-9):
            raise ValueError(f"memory.capacity: {self.capacity.value:g} {self.capacity.unit} is not the largest of "
                             f"memory.options ({_sizes_text(b / GiB for b in self.options.base)}); the capacity "
                             "is the largest size sold")
        self.bandwidth.require("bytes_per_s", "memory.bandwidth", positive=True)
        if self.bus_width is not None:
            self.bus_width.require("bits", "memory.bus_width")
        if self.data_rate is not None:
            self.data_rate.require("bits_per_s_per_pin", "memory.data_rate")
        return self

    @property
    def derived_bandwidth_bytes_per_s(self) -> float | None:
        """Bus width × per-pin data rate, when both are published."""
        if self.bus_width is None or self.data_rate is None:
            return None
        return self.bus_width.base * self.data_rate.base / BITS_PER_BYTE


class Link(Frozen):
    """A host or scale-up link; bandwidth is per device and per direction."""

    kind: str = Field(description="e.g. 'PCIe 5.0 x16', 'NVLink 4', 'NVLink-C2C', 'Infinity Fabric'")
    bandwidth: Quantity = Field(description="per device, one direction")
    domain_devices: int | None = Field(
        default=None, ge=2, le=1024, description="devices this link joins into one scale-up domain (a GB200 NVL72 "
                                                 "rack: 72), as the bandwidth's source states; None: not stated")

    @model_validator(mode="after")
    def _unit(self) -> "Link":
        self.bandwidth.require("bytes_per_s", "link.bandwidth", positive=True)
        return self


class Price(Frozen):
    """A published price: purchase (USD) or cloud rental (USD/h), with its date."""

    value: float = Field(gt=0)
    unit: str = Field(pattern=r"^USD(/h)?$")
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$", description="YYYY-MM or YYYY-MM-DD")
    kind: str = Field(description="msrp | street | cloud_on_demand")
    source: str = Field(min_length=8)


class Hardware(Frozen):
    """One device as its datasheet describes it."""

    name: str
    aliases: list[str] = Field(default_factory=list, description="short names and the exact NVML names")
    vendor: str
    device_class: DeviceClass
    release_year: Quantity
    memory: Memory
    dense_peak: dict[str, Quantity] = Field(description="dense peak throughput per compute dtype")
    cache: Quantity | None = Field(default=None, description="last-level on-chip cache (L2, Infinity Cache, SLC)")
    streaming_multiprocessors: Quantity | None = Field(
        default=None, description="NVIDIA GPUs: the streaming multiprocessors the product enables (unit SM); a "
                                  "kernel whose bytes in flight per SM are bounded streams at most a fixed rate "
                                  "per SM (docs/formulas.md §9)")
    boost_clock: Quantity | None = Field(default=None, description="the GPU clock the vendor's peak rates assume "
                                                                   "(MHz); with the SM count it checks the FP32 peak")
    host_link: Link | None = None
    scale_up_link: Link | None = None
    tdp: Quantity
    price: Price | None = Field(default=None, description="purchase price (USD): msrp or street")
    cloud_price: Price | None = Field(default=None, description="on-demand rental per device-hour (USD/h)")
    notes: str | None = None

    @model_validator(mode="after")
    def _check(self) -> "Hardware":
        unknown = set(self.dense_peak) - set(COMPUTE_DTYPES)
        if unknown:
            raise ValueError(f"dense_peak: unknown dtypes {sorted(unknown)}; use {COMPUTE_DTYPES}")
        if not {"bf16", "fp16", "fp32"} & set(self.dense_peak):
            raise ValueError("dense_peak: needs a bf16, fp16 or fp32 peak (attention runs at one of them)")
        for dtype, peak in self.dense_peak.items():
            peak.require("flops_per_s", f"dense_peak.{dtype}", positive=True)
        if self.cache is not None:
            self.cache.require("bytes", "cache")
        if self.streaming_multiprocessors is not None:
            self.streaming_multiprocessors.require("count", "streaming_multiprocessors", positive=True)
        if self.boost_clock is not None:
            self.boost_clock.require("hertz", "boost_clock", positive=True)
        self.tdp.require("watts", "tdp")
        if self.price is not None and self.price.unit != "USD":
            raise ValueError("price: a purchase price in USD; rental prices go in cloud_price (USD/h)")
        if self.cloud_price is not None and self.cloud_price.unit != "USD/h":
            raise ValueError("cloud_price: USD/h per device")
        return self

    @property
    def memory_capacity_bytes(self) -> float:
        return self.memory.capacity.base

    @property
    def memory_options_gib(self) -> tuple[float, ...] | None:
        """The capacities this device is sold with (GiB, ascending), or None when its entry records one size."""
        options = self.memory.options
        return None if options is None else tuple(b / GiB for b in options.base)

    def with_memory_gib(self, capacity_gib: float) -> "Hardware":
        """This device with ``capacity_gib`` of memory, one of ``memory.options``: a copy with memory.capacity replaced.

        The largest size (the entry's capacity) returns the device itself; so does the one size of an
        entry without options. Any other size is a :class:`ConfigurationError` naming the sizes sold.
        The copy is not revalidated: its capacity is an option, no longer the largest.
        """
        sizes = self.memory_options_gib or (self.memory_capacity_bytes / GiB,)
        match = next((i for i, s in enumerate(sizes) if math.isclose(s, capacity_gib, rel_tol=1e-9)), None)
        if match is None:
            if self.memory.options is None:
                raise ConfigurationError(
                    f"{self.name} is not sold with {capacity_gib:g} GiB of memory as far as the database records: "
                    f"its entry has one size, {_sizes_text(sizes)}, and no memory.options")
            raise ConfigurationError(f"{self.name} is not sold with {capacity_gib:g} GiB of memory; "
                                     f"it is sold with {_sizes_text(sizes)}")
        if match == len(sizes) - 1:
            return self
        options = self.memory.options
        capacity = Quantity(value=options.value[match], unit=options.unit, source=options.source,
                            note=f"one of the sizes sold ({_sizes_text(sizes)}), chosen instead of the largest")
        return self.model_copy(update={"memory": self.memory.model_copy(update={"capacity": capacity})})

    @property
    def memory_bandwidth_bytes_per_s(self) -> float:
        return self.memory.bandwidth.base

    def peak_flops_per_s(self, dtype: str) -> float | None:
        """Dense peak for ``dtype``, or None when the device does not publish one.

        "mxfp8" is an FP8 GEMM with OCP Microscaling block scales on either operand (MXFP4 weights times MXFP8
        activations): it runs at the device's FP8 rate where the tensor cores take block-scaled operands,
        which arrived with their FP4 support (NVIDIA Blackwell's block-scaled MMA, AMD CDNA4), so a device that
        lists an FP4 peak; elsewhere it has none (Hopper's FP8 MMA takes no block scales; docs/formulas.md §1)."""
        if dtype == "mxfp8":
            return self.peak_flops_per_s("fp8") if self.peak_flops_per_s("fp4") else None
        peak = self.dense_peak.get(dtype)
        return None if peak is None else peak.base

    @property
    def fp32_lanes_per_sm(self) -> float | None:
        """FP32 peak / (2 × SMs × boost clock), when all three are recorded: 64 or 128 on NVIDIA parts (an FMA is two
        FLOPs), so anything else is a slip in one of them."""
        fp32 = self.peak_flops_per_s("fp32")
        if self.streaming_multiprocessors is None or self.boost_clock is None or fp32 is None:
            return None
        return fp32 / (2 * self.streaming_multiprocessors.value * self.boost_clock.base)

    @property
    def ridge_point_flops_per_byte(self) -> float:
        """Arithmetic intensity where bf16 (or fp16) compute meets bandwidth."""
        peak = self.peak_flops_per_s("bf16") or self.peak_flops_per_s("fp16") or self.peak_flops_per_s("fp32")
        return peak / self.memory_bandwidth_bytes_per_s
