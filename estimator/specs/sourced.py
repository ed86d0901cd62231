"""A number together with its unit and the place it was published.

Every number in ``hardware_db/`` and ``models_db/`` is a :class:`Quantity`, so a
value can never lose its source or its unit on the way in.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from estimator.units import UNIT_DIMENSIONS, UNIT_FACTORS, to_base


class Frozen(BaseModel):
    """Base for every spec: immutable, an unknown key is an error, not a default, and so is NaN or inf."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class Quantity(Frozen):
    """A published number: value, unit, source URL and an optional note on the variant."""

    value: float = Field(ge=0, le=1e30, description="finite; 10^30 in any unit is beyond every device")
    unit: str
    source: str = Field(min_length=8, description="URL (or document and page) the value is taken from")
    note: str | None = Field(default=None, description="variant: dense/sparse, one-way/bidirectional, derived arithmetic ...")

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, unit: str) -> str:
        if unit not in UNIT_FACTORS:
            raise ValueError(f"unknown unit {unit!r}; use one of: {', '.join(UNIT_FACTORS)}")
        return unit

    @property
    def base(self) -> float:
        """The value in the base unit of its dimension (bytes, bytes/s, FLOP/s, ...)."""
        return to_base(self.value, self.unit)

    def require(self, dimension: str, field: str, positive: bool = False) -> "Quantity":
        """Raise unless this quantity's unit measures ``dimension`` (and, if ``positive``, its value is above 0)."""
        if UNIT_DIMENSIONS[self.unit] != dimension:
            raise ValueError(f"{field}: unit {self.unit!r} is not a {dimension} unit")
        if positive and self.value <= 0:
            raise ValueError(f"{field}: must be greater than 0, got {self.value:g}")
        return self
