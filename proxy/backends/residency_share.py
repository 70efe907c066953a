"""Session-aware admission's residency shared by replicas through Redis (`--redis-url`), off the
request path, as the session table is (proxy/backends/session_share.py).

Each replica owns its residency (proxy/backends/residency.py) and publishes all of it every
`session_flush_s`: one key `<prefix>:resid:<replica>` (per engine: resident sessions, their
prefix tokens, since when idle; waiting sessions and since when; the shared prefix), with a TTL
of `TTL_FLUSHES` flushes, and the replica in the index `<prefix>:resid-replicas` (scored by wall
time, trimmed past the TTL). Every `session_pull_s` it reads the other live replicas' keys and
hands them to its residency (`Residency.remote`): the rule then counts every replica's resident
prefixes against the engine's KV, and every replica's waiting sessions in its first come first
served order (each replica admits only its own). A replica that stops publishing drops out
after the TTL.

Staleness: another replica's admission is seen within flush + pull (1.5 s by default): two
replicas may admit within that window what only one would have; the next turn boundary and
idleness put it right. Redis away: each replica decides from its own residency, failures are
counted in `specrouter_session_share_errors_total{op="resid-flush|resid-pull"}`.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable
from typing import Any, Final

import orjson

from policies.admission import Resident, Waiter
from proxy.backends.redis_loops import IO_TIMEOUT_S, RedisLoops
from proxy.backends.residency import Remote, Residency
from proxy.bounds import token_count
from proxy.observe.metrics import GatewayMetrics
from proxy.settings import Settings

TTL_FLUSHES: Final = 10  # a replica's state outlives it by this many flushes
MAX_ROWS: Final = 10_000  # resident plus waiting sessions per engine, each way
_KEY = re.compile(r"s-[0-9a-f]{32}")


class ResidencyShare(RedisLoops):
    def __init__(
        self,
        residency: Residency,
        settings: Settings,
        metrics: GatewayMetrics,
        replica: str,
        client: Any = None,
    ) -> None:
        import redis.asyncio as aioredis

        assert settings.redis_url is not None
        self.residency, self.replica = residency, replica
        self.flush_s, self.pull_s = settings.session_flush_s, settings.session_pull_s
        self.ttl_s = max(1.0, TTL_FLUSHES * self.flush_s)
        self._key = f"{settings.redis_prefix}:resid:"
        self._index = f"{settings.redis_prefix}:resid-replicas"
        self._redis: Any = client or aioredis.Redis.from_url(
            settings.redis_url, socket_timeout=IO_TIMEOUT_S, socket_connect_timeout=IO_TIMEOUT_S
        )
        self._errors = metrics.session_share_errors
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(self.flush_s, "resid-flush", self.flush)),
            loop.create_task(self._every(self.pull_s, "resid-pull", self.pull)),
        ]

    async def flush(self) -> int:
        """Publish this replica's residency; the engines published."""
        offset = time.time() - time.perf_counter()  # monotonic -> wall
        state = self.residency.local(offset, MAX_ROWS)
        wall = time.time()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._key + self.replica, orjson.dumps(state), px=int(self.ttl_s * 1000))
        pipe.zadd(self._index, {self.replica: wall})
        pipe.zremrangebyscore(self._index, "-inf", wall - self.ttl_s)
        await pipe.execute()
        return len(state)

    async def pull(self) -> int:
        """Read the other live replicas' residency; the replicas read."""
        members = await self._redis.zrangebyscore(self._index, time.time() - self.ttl_s, "+inf")
        others = [m.decode() if isinstance(m, bytes) else str(m) for m in members]
        others = [r for r in others if r != self.replica][:64]
        values = await self._redis.mget([self._key + r for r in others]) if others else []
        offset = time.time() - time.perf_counter()  # wall -> monotonic
        remote: dict[str, Remote] = {}
        for value in values:
            if value is not None:
                _merge(remote, value, offset)
        self.residency.remote = remote
        return len(values)


def _merge(remote: dict[str, Remote], value: bytes, offset: float) -> None:
    """One replica's published state into `remote`; anything malformed is skipped."""
    try:
        state = orjson.loads(value)
    except orjson.JSONDecodeError:
        return
    if not isinstance(state, dict):
        return
    for engine, data in list(state.items())[:256]:
        if not isinstance(engine, str) or not 0 < len(engine) <= 128 or not isinstance(data, dict):
            continue
        residents, waiting, shared = remote.get(engine, ((), (), 0))
        new_res = [
            Resident(k, n, None if t is None else t - offset)
            for k, n, t in _rows(data.get("residents"), _resident)
        ]
        new_wait = [Waiter(k, t - offset, p) for k, t, p in _rows(data.get("waiting"), _waiter)]
        own = token_count(data.get("shared")) or 0
        remote[engine] = (
            (*residents, *new_res),
            tuple(sorted((*waiting, *new_wait), key=lambda w: w.since)),
            max(shared, own),
        )


def _rows(rows: Any, parse: Callable[[Any], Any]) -> list[Any]:
    if not isinstance(rows, list):
        return []
    out = [parse(r) for r in rows[:MAX_ROWS]]
    return [r for r in out if r is not None]


def _resident(row: Any) -> tuple[str, int, float | None] | None:
    if not isinstance(row, list) or len(row) != 3:
        return None
    key, tokens, idle = row
    n = token_count(tokens)
    if not _is_key(key) or n is None or not (idle is None or _is_time(idle)):
        return None
    return key, n, None if idle is None else float(idle)


def _waiter(row: Any) -> tuple[str, float, bool] | None:
    if not isinstance(row, list) or len(row) != 3:
        return None
    key, since, present = row
    if not _is_key(key) or not _is_time(since) or not isinstance(present, bool):
        return None
    return key, float(since), present


def _is_key(value: Any) -> bool:
    return isinstance(value, str) and _KEY.fullmatch(value) is not None


def _is_time(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
