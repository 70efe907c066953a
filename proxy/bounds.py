"""Bounds on the numbers (and names) the gateway stores or counts, applied where they come in.

A client's sampling numbers and an engine's token counts end in SQLite (64-bit integers), in
typed arrays (32-bit), in Prometheus counters and in the dashboard's arithmetic. A value none
of them can hold (`"temperature": 9223372036854775808`, an engine claiming 2^63 tokens) once
made the request log drop every row of its batch, other clients' included. So each such value
is bounded here, at the edge: a count outside `[0, MAX_TOKEN_COUNT]` is no count (as a missing
one), a number that is not finite is no number. The request is served as before; only what the
gateway records of it is bounded.
"""

from __future__ import annotations

import math
from typing import Any, Final

# Tokens one request can report: above any model's context (2^31 - 1, so a decode step's count
# fits the measurement's 32-bit arrays and every sum of a few fits SQLite's 64-bit integers).
MAX_TOKEN_COUNT: Final = 2**31 - 1
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


def token_count(value: Any) -> int | None:
    """An engine's token count when it is one (an integer in [0, MAX_TOKEN_COUNT]), else None."""
    if type(value) is int and 0 <= value <= MAX_TOKEN_COUNT:
        return value
    return None


def finite_number(value: Any) -> float | None:
    """A JSON number as a finite float (2^63 becomes 9.2e18), else None."""
    if type(value) not in (int, float):
        return None
    try:
        out = float(value)
    except OverflowError:  # an integer beyond a double's range
        return None
    return out if math.isfinite(out) else None


def storable(row: tuple[Any, ...]) -> bool:
    """Whether SQLite can bind every value of `row`: its integers within 64 bits (a float, a
    string, bytes and None always bind; text that is not UTF-8 fails at insert instead)."""
    for value in row:
        if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
            return False
    return True


# A client's model name as the gateway keeps it past its request (the record in the dashboard's
# recent requests; telemetry names only the policy's models): 300 requests naming 1 MB models
# otherwise held 200 of them, 200 MB, until 200 more requests came.
MAX_KEPT_NAME_CHARS: Final = 256


def kept_name(value: str) -> str:
    """A client's name for something (a model), cut to what the gateway keeps of it."""
    return value[:MAX_KEPT_NAME_CHARS]


# Any /metrics sample the gateway reads (counters and gauges of things that cannot be negative):
# exact as a float. NaN, an infinity, a negative or larger value is not read (it froze a
# backend's health at its last value and reached the load state and the dashboard).
MAX_METRIC_VALUE: Final = float(1 << 53)


def metric_value(value: float) -> float | None:
    """A /metrics sample as a finite number in [0, MAX_METRIC_VALUE], or None."""
    return value if 0.0 <= value <= MAX_METRIC_VALUE else None  # NaN compares false
