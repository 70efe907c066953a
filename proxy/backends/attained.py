"""A session's attained service: tokens served for it over a sliding window, in minute buckets.

What the relay measures at the end of each request of the session (prompt tokens minus those
the engine had cached, plus completion tokens: the work the engine did for it) is added to the
bucket of its minute; `total(now, window_s)` sums the buckets that began within the window, so
the window is exact to a bucket (60 s). At most `MAX_BUCKETS` are kept (the policy's longest
window, policies/spec/fairness.py), a few dozen bytes per session. The session table holds one
per row (proxy/backends/session_table.py) and replicas share it with the row
(proxy/backends/session_share.py); policies/fairness.py turns the total into a level.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from policies.spec.fairness import MAX_WINDOW_S
from proxy.bounds import token_count

BUCKET_S: Final = 60.0
MAX_BUCKETS: Final = int(MAX_WINDOW_S // BUCKET_S) + 1


def served_tokens(prompt: int | None, cached: int | None, completion: int | None) -> int:
    """The engine's work for one request: its uncached prompt tokens plus its output."""
    return max(0, (prompt or 0) - (cached or 0)) + max(0, completion or 0)


class AttainedWindow:
    """(bucket start, tokens) pairs, oldest first; times on the owner's monotonic clock."""

    __slots__ = ("buckets",)

    def __init__(self, buckets: Iterable[tuple[float, int]] = ()) -> None:
        self.buckets: list[list[float | int]] = [[t, n] for t, n in buckets][-MAX_BUCKETS:]

    def add(self, tokens: int, now: float) -> None:
        if tokens <= 0:
            return
        last = self.buckets[-1] if self.buckets else None
        if last is not None and 0 <= now - last[0] < BUCKET_S:
            last[1] = int(last[1]) + tokens
        else:
            self.buckets.append([now, tokens])
            if len(self.buckets) > MAX_BUCKETS:
                del self.buckets[0]

    def total(self, now: float, window_s: float) -> int:
        since = now - window_s
        return sum(int(n) for t, n in self.buckets if t > since)

    def pairs(self, offset: float = 0.0) -> list[tuple[float, int]]:
        """The buckets as (start + offset, tokens): `offset` moves them to another clock."""
        return [(float(t) + offset, int(n)) for t, n in self.buckets]


def parse_pairs(value: object, offset: float) -> list[tuple[float, int]] | None:
    """Shared buckets back from JSON ([[wall start, tokens], ...]), moved by `offset`; None
    when not that shape, or a count is not a token count (proxy/bounds.py)."""
    if not isinstance(value, list) or len(value) > MAX_BUCKETS:
        return None
    out: list[tuple[float, int]] = []
    for item in value:
        if not isinstance(item, list) or len(item) != 2:
            return None
        t, n = item
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            return None
        count = token_count(n)
        if count is None:
            return None
        out.append((float(t) - offset, count))
    return out
