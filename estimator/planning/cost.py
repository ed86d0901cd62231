"""What a device-hour costs: cloud prices, or purchase and power on premises.

Cost per device-hour (:func:`hourly_cost`):
- cloud: the on-demand price per device-hour;
- on-premises: purchase price / (amortization years × 8760 h) + TDP × utilization × PUE × energy price.
Cost per million output tokens = devices × cost per device-hour / (output tokens/s × 3600) × 10⁶.
"""

from __future__ import annotations

from estimator.planning.spec import DevicePrice, Prices

HOURS_PER_YEAR = 8760


def price_age_months(date: str, today=None) -> int:
    """Whole months between a price's YYYY-MM(-DD) date and today."""
    from datetime import date as _date
    today = today or _date.today()
    year, month = (int(x) for x in date.split("-")[:2])
    return (today.year - year) * 12 + today.month - month


def purchase_price(hw, prices: Prices) -> float | None:
    """A device's purchase price: the plan's override, else the database's."""
    override = prices.devices.get(hw.name, DevicePrice()).purchase_usd
    return override or (hw.price.value if hw.price else None)


def hourly_cost(hw, prices: Prices, deployment: str) -> tuple[float | None, str]:
    """Cost of one device-hour and where its price comes from (None when no price is known)."""
    override = prices.devices.get(hw.name, DevicePrice())
    if deployment == "cloud":
        if override.cloud_usd_per_hour:
            return override.cloud_usd_per_hour, "plan override"
        if hw.cloud_price:
            p = hw.cloud_price
            return p.value, f"{p.source} ({p.date}, {price_age_months(p.date)} months old)"
        return None, "no cloud price"
    purchase = purchase_price(hw, prices)
    if purchase is None:
        return None, "no purchase price"
    source = "plan override" if override.purchase_usd else \
        f"{hw.price.source} ({hw.price.date}, {price_age_months(hw.price.date)} months old)"
    energy = hw.tdp.base * prices.utilization * prices.pue / 1000 * prices.energy_usd_per_kwh
    return purchase / (prices.amortization_years * HOURS_PER_YEAR) + energy, source
