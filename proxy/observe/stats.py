"""Small, dependency-free statistics shared by the dashboard, the report and the probe."""

from __future__ import annotations

from collections.abc import Sequence


def quantile(values: Sequence[float], q: float, *, presorted: bool = False) -> float | None:
    """Linear-interpolated quantile (numpy's default), None for no values."""
    if not values:
        return None
    ordered = values if presorted else sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
