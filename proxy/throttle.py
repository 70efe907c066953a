"""Failed authentication, throttled per source address (both listeners).

After `limit` failures within a minute a source gets 429 with Retry-After on every request that
needs a credential, the right one included: answering a good guess would let guessing go on.
Only presented credentials count (a missing header is no guess). Memory is bounded: the least
recently seen sources are forgotten first. Each source is logged at most once a minute.
"""

from __future__ import annotations

import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("specrouter.auth")

WINDOW_S = 60.0


@dataclass(slots=True)
class _Source:
    failures: deque[float] = field(default_factory=deque)
    logged: float = -math.inf


class AuthThrottle:
    def __init__(
        self,
        limit: int,
        *,
        listener: str,
        max_sources: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.listener, self.max_sources = limit, listener, max_sources
        self._clock = clock
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def retry_after(self, source: str) -> int | None:
        """Whole seconds until `source` may try again, or None when it may now."""
        entry = self._sources.get(source)
        if self.limit <= 0 or entry is None:
            return None
        now = self._clock()
        while entry.failures and entry.failures[0] <= now - WINDOW_S:
            entry.failures.popleft()
        if len(entry.failures) < self.limit:
            return None
        return max(1, math.ceil(entry.failures[0] + WINDOW_S - now))

    def failed(self, source: str) -> None:
        if self.limit <= 0:
            return
        now = self._clock()
        entry = self._sources.pop(source, None) or _Source()
        self._sources[source] = entry  # most recent last
        entry.failures.append(now)
        while len(entry.failures) > self.limit:
            entry.failures.popleft()
        while len(self._sources) > self.max_sources:
            self._sources.popitem(last=False)
        if now - entry.logged >= WINDOW_S:
            entry.logged = now
            log.warning(
                "failed authentication on the %s listener from %s (%d in the last "
                "minute; %d allowed)",
                self.listener,
                source,
                sum(1 for t in entry.failures if t > now - WINDOW_S),
                self.limit,
            )


def source_of(scope: Mapping[str, Any]) -> str:
    """The peer address of an ASGI connection ("" when the server gives none)."""
    client = scope.get("client")
    return str(client[0]) if isinstance(client, tuple | list) and client else ""
