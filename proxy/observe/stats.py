"""Small, dependency-free statistics shared by the dashboard, the report and the probe."""

from __future__ import annotations

import math
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


def weighted_quantile(values: Sequence[float], weights: Sequence[int], q: float) -> float | None:
    """`quantile` of the list where values[i] appears weights[i] times, without building it:
    its cost follows the number of values, not the weights (an engine claiming 30 M tokens for
    one step once made the dashboard build a 30 M-element list per snapshot)."""
    total = sum(weights)
    if total <= 0:
        return None
    order = sorted(range(len(values)), key=values.__getitem__)
    return weighted_at(values, weights, order, total, q)


def weighted_at(
    values: Sequence[float], weights: Sequence[int], order: Sequence[int], total: int, q: float
) -> float:
    """`weighted_quantile` given the values' sorted `order` and the weights' `total` > 0."""
    pos = q * (total - 1)
    lo = math.floor(pos)
    frac = pos - lo
    seen = 0
    for rank, i in enumerate(order):
        seen += weights[i]
        if seen > lo:  # expanded index lo holds this value
            if frac == 0 or seen > lo + 1 or rank + 1 == len(order):
                return values[i]  # index lo + 1 holds it too (or there is none)
            return values[i] + (values[order[rank + 1]] - values[i]) * frac
    return values[order[-1]]
