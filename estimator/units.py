"""Unit constants, defined once.

Inside ``estimator`` every quantity is in base units: bytes, FLOPs, seconds,
bytes/s, FLOP/s. Prefixes appear only at the edges: when YAML is read
(:func:`to_base`) and when numbers are printed.

Memory capacity is usually binary (an "80 GB" H100 holds 80 GiB); bandwidth and
FLOP/s are decimal (3.35 TB/s). Both kinds are defined here so that nobody has
to guess, and a YAML quantity must name which one it uses.
"""

from __future__ import annotations

KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

GFLOPS = 10**9
TFLOPS = 10**12
PFLOPS = 10**15

BITS_PER_BYTE = 8

# Every unit a database file may use, mapped to the factor that turns it into
# the base unit of its dimension. "TOPS" is integer operations per second and
# is treated as FLOP/s: a multiply-add counts as two operations in both.
UNIT_FACTORS: dict[str, float] = {
    # capacity (bytes)
    "B": 1, "KB": KB, "MB": MB, "GB": GB, "TB": TB,
    "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": TiB,
    # bandwidth (bytes/s)
    "GB/s": GB, "TB/s": TB,
    # throughput (FLOP/s)
    "GFLOPS": GFLOPS, "TFLOPS": TFLOPS, "PFLOPS": PFLOPS, "TOPS": TFLOPS,
    # per-pin data rate (bit/s)
    "Gbps": 10**9, "MT/s": 10**6,
    # clock frequency (Hz)
    "MHz": 10**6, "GHz": 10**9,
    # widths, power, time, money, counts (SM: NVIDIA's streaming multiprocessors)
    "bit": 1, "W": 1, "year": 1, "USD": 1, "USD/h": 1, "count": 1, "SM": 1,
}

UNIT_DIMENSIONS: dict[str, str] = {
    **dict.fromkeys(["B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"], "bytes"),
    **dict.fromkeys(["GB/s", "TB/s"], "bytes_per_s"),
    **dict.fromkeys(["GFLOPS", "TFLOPS", "PFLOPS", "TOPS"], "flops_per_s"),
    **dict.fromkeys(["Gbps", "MT/s"], "bits_per_s_per_pin"),
    "bit": "bits", "W": "watts", "year": "year", "USD": "usd", "USD/h": "usd_per_h",
    "MHz": "hertz", "GHz": "hertz", "count": "count", "SM": "count",
}


def to_base(value: float, unit: str) -> float:
    """Convert ``value`` given in ``unit`` to the base unit of its dimension.

    Examples
    --------
    How many bytes per second is 3.35 TB/s?

    >>> to_base(3.35, "TB/s")
    3350000000000.0
    """
    try:
        return float(value) * UNIT_FACTORS[unit]
    except KeyError:
        raise ValueError(
            f"unknown unit {unit!r}; known units are: {', '.join(UNIT_FACTORS)}"
        ) from None
