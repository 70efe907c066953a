"""Failed authentication, throttled per source address and per source network (both listeners).

After `limit` failures within a minute a source gets 429 with Retry-After on every request that
needs a credential, the right one included: answering a good guess would let guessing go on.
Only presented credentials count (a missing header is no guess). Memory is bounded: the least
recently seen sources are forgotten first. Each source is logged at most once a minute.

A network (IPv4 /24, IPv6 /64) gets `NETWORK_FACTOR` times the limit over all its addresses:
1,000 wrong keys spread over 125 addresses (8 each, under a limit of 10) were never throttled.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("specrouter.auth")

WINDOW_S = 60.0
NETWORK_FACTOR = 8  # a network's failures, over all its addresses: 8x one address's limit


@functools.lru_cache(maxsize=1024)  # ipaddress costs ~10 us a call; clients come back
def network_of(source: str) -> str | None:
    """The /24 (IPv4) or /64 (IPv6) around an address, as a key; None for no address."""
    try:
        addr = ipaddress.ip_address(source)
    except ValueError:
        return None
    bits = 24 if addr.version == 4 else 64
    return "net:" + str(ipaddress.ip_network(f"{addr}/{bits}", strict=False))


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
        if self.limit <= 0 or not self._sources:  # no failure on record: nothing to look up
            return None
        waits = [
            self._wait(key, limit) for key, limit in self._keys(source) if key in self._sources
        ]
        found = [w for w in waits if w is not None]
        return max(found) if found else None

    def _keys(self, source: str) -> list[tuple[str, int]]:
        net = network_of(source)
        own = [(source, self.limit)]
        return own if net is None else [*own, (net, self.limit * NETWORK_FACTOR)]

    def _wait(self, key: str, limit: int) -> int | None:
        entry = self._sources[key]
        now = self._clock()
        while entry.failures and entry.failures[0] <= now - WINDOW_S:
            entry.failures.popleft()
        if len(entry.failures) < limit:
            return None
        return max(1, math.ceil(entry.failures[0] + WINDOW_S - now))

    def failed(self, source: str) -> None:
        if self.limit <= 0:
            return
        now = self._clock()
        for key, limit in self._keys(source):
            counted = self._sources.pop(key, None) or _Source()
            self._sources[key] = counted  # most recent last
            counted.failures.append(now)
            while len(counted.failures) > limit:
                counted.failures.popleft()
        entry = self._sources[source]
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
