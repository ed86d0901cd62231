"""Numbers and tables as text: prefixes at the edge (base units come in, strings go out).

A number that is not finite is never printed: text shows "n/a" and JSON holds null.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Sequence

from estimator.units import GB, KB, MB

NOT_AVAILABLE = "n/a"


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def seconds(value: float) -> str:
    if not _finite(value):
        return NOT_AVAILABLE
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.2f} ms"
    return f"{value * 1e6:.1f} us"


def rate(value: float) -> str:
    if not _finite(value):
        return NOT_AVAILABLE
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def gigabytes(value: float) -> str:
    """Decimal bytes with a prefix that keeps small terms readable."""
    if not _finite(value):
        return NOT_AVAILABLE
    if value >= 0.1 * GB or value == 0:
        return f"{value / GB:.2f} GB"
    if value >= 0.1 * MB:
        return f"{value / MB:.1f} MB"
    return f"{value / KB:.1f} kB"


def table(rows: Sequence[Sequence[str]], header: Sequence[str] | None = None, indent: int = 2,
          align_numbers: bool = True) -> str:
    """Text columns, left-aligned; numbers right-aligned unless ``align_numbers`` is False."""
    all_rows = ([list(header)] if header else []) + [list(map(str, r)) for r in rows]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))]

    def fmt(row):
        cells = [c.rjust(w) if align_numbers and _numeric(c) else c.ljust(w) for c, w in zip(row, widths)]
        return " " * indent + "  ".join(cells).rstrip()

    lines = [fmt(r) for r in all_rows]
    if header:
        lines.insert(1, " " * indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _numeric(cell: str) -> bool:
    return bool(cell) and (cell[0].isdigit() or cell[0] in "-+.") and any(ch.isdigit() for ch in cell)


def _json_ready(data):
    """``data`` made JSON-ready: numpy scalars and arrays become Python numbers and lists, NaN and inf None."""
    if hasattr(data, "tolist"):  # numpy scalar or array
        data = data.tolist()
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {str(k): _json_ready(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_json_ready(v) for v in data]
    return data


def to_json(data, indent: int | None = 2) -> str:
    """Strict JSON (no NaN or Infinity, which JSON does not have): non-finite numbers are null."""
    return json.dumps(_json_ready(data), indent=indent, allow_nan=False)


def stderr_progress(line: str) -> None:
    """A progress line on stderr: rewritten in place on a terminal, one line each in a log."""
    sys.stderr.write(("\r" if sys.stderr.isatty() else "") + line.ljust(70) + ("" if sys.stderr.isatty() else "\n"))
    sys.stderr.flush()
