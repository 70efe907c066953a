"""Failed authentication, throttled per source address and per source network (both listeners,
the dashboard's login included).

After `limit` failures within a minute a source gets 429 with Retry-After on every request that
needs a credential, the right one included: answering a good guess would let guessing go on.
Only presented credentials count (a missing header is no guess). Memory is bounded: the least
recently seen sources are forgotten first. Each source is logged at most once a minute.

A network (IPv4 /24, IPv6 /64) gets `NETWORK_FACTOR` times the limit over all its addresses:
1,000 wrong keys spread over 125 addresses (8 each, under a limit of 10) were never throttled.
Its count refuses only the addresses that failed themselves within the window: 80 failures from
nine addresses of a /24 once locked out every address of it, a client with the right key
included. So once a network is over its count each of its addresses has one guess, then waits.
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
    """The /24 (IPv4) or /64 (IPv6) around an address, as a key; None for no address. An
    IPv4 client of a dual-stack listener (`::ffff:a.b.c.d`) is in its IPv4 /24, not in the one
    /64 that every such client shares."""
    try:
        addr = ipaddress.ip_address(source)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
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
        """Whole seconds until `source` may try again, or None when it may now (asked before
        its credential is read). Its network's count decides only for an address with failures
        of its own in the window: others' failures never refuse a right key."""
        if self.limit <= 0 or source not in self._sources:  # no failure of its own on record
            return None
        own = self._recent(source)
        if not own:
            return None
        waits = [self._wait(own, self.limit)]
        net = network_of(source)
        if net is not None and net in self._sources:
            waits.append(self._wait(self._recent(net), self.limit * NETWORK_FACTOR))
        found = [w for w in waits if w is not None]
        return max(found) if found else None

    def _keys(self, source: str) -> list[tuple[str, int]]:
        net = network_of(source)
        own = [(source, self.limit)]
        return own if net is None else [*own, (net, self.limit * NETWORK_FACTOR)]

    def _recent(self, key: str) -> deque[float]:
        """`key`'s failures within the window."""
        failures = self._sources[key].failures
        now = self._clock()
        while failures and failures[0] <= now - WINDOW_S:
            failures.popleft()
        return failures

    def _wait(self, failures: deque[float], limit: int) -> int | None:
        if len(failures) < limit:
            return None
        return max(1, math.ceil(failures[0] + WINDOW_S - self._clock()))

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
