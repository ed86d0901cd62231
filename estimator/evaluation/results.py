"""A sweep's results: one numpy array per column, one row per configuration."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from estimator.errors import ConfigurationError
from estimator.physics.roofline import BOUND_NAMES

# The axes of a sweep, in the order its rows run (C order).
AXES = ("model", "hardware", "weight_format", "kv_format", "layout", "batch", "prompt_tokens", "output_tokens",
        "serving")
BOUND_COLUMNS = ("prefill_bound", "decode_bound")


@dataclass(frozen=True)
class ResultTable:
    """Results of a sweep: one row per configuration, one numpy array per column.

    ``index`` holds, per axis, the position of each row's value in ``labels``;
    :meth:`to_pandas` turns both into a DataFrame with categorical label columns.
    """

    columns: dict[str, np.ndarray]
    index: dict[str, np.ndarray]
    labels: dict[str, list]
    compute_dtypes: list[list[str]] = field(repr=False)  # [format][hardware]

    def __len__(self) -> int:
        return len(next(iter(self.columns.values())))

    def label(self, axis: str, row: int):
        return self.labels[axis][int(self.index[axis][row])]

    def row(self, i: int) -> dict:
        """One configuration as a plain dict: its labels, then every result column."""
        out = {axis: self.label(axis, i) for axis in AXES}
        out["compute_dtype"] = self.compute_dtypes[int(self.index["weight_format"][i])][int(self.index["hardware"][i])]
        out.update({k: v[i].item() for k, v in self.columns.items()})
        for phase in BOUND_COLUMNS:
            if phase in out:
                out[phase] = BOUND_NAMES[int(out[phase])]
        return out

    def to_pandas(self):
        """A pandas DataFrame (pandas is imported only here)."""
        import pandas as pd

        frame = {axis: pd.Categorical.from_codes(self.index[axis], categories=_unique(self.labels[axis]))
                 if isinstance(self.labels[axis][0], str) else np.asarray(self.labels[axis])[self.index[axis]]
                 for axis in AXES}
        frame.update(self.columns)
        df = pd.DataFrame(frame)
        for phase in BOUND_COLUMNS:
            if phase in df:
                df[phase] = pd.Categorical.from_codes(df[phase].astype(int), categories=list(BOUND_NAMES))
        return df


def _unique(names: list[str]) -> list[str]:
    if len(set(names)) != len(names):
        raise ConfigurationError(f"duplicate entries in a sweep axis: {names}")
    return names
