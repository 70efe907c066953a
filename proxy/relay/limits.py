"""Per-client limits: requests open at once, and requests per minute (GCRA).

In-process by default; with `--redis-url` the counts live in Redis so that gateway replicas
behind one load balancer enforce one limit together. Either way a refusal is 429 with
Retry-After, and nothing else about the request is touched.

Redis away, hung or answering nonsense: the limits fail over to this replica's own in-process
counts (each replica then enforces the whole limit by itself, so N replicas admit up to N times
it) rather than refusing every limited client: a limit protects the engines, and the local count
still does; refusing would turn a Redis outage into an outage of the API. A Redis call waits at
most `IO_TIMEOUT_S`; after a failure Redis is left alone for `RETRY_AFTER_S`, so a hung Redis
costs one request in that time the wait, not each. Failures are logged once per outage and
counted (`specrouter_limits_redis_errors_total`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Final, Protocol

if TYPE_CHECKING:
    from prometheus_client import Counter

log = logging.getLogger("specrouter.limits")

BURST_S = 60.0  # a per-minute limit may be used in one burst, then paces at its rate
IO_TIMEOUT_S: Final = 0.5  # one limits round trip (sub-millisecond on a LAN)
RETRY_AFTER_S: Final = 5.0  # Redis left alone this long after a failure


class Limits(Protocol):
    async def enter(self, client: str, max_concurrent: int | None, rpm: int | None) -> float | None:
        """None when admitted (then `leave` must follow), else seconds to wait."""

    async def leave(self, client: str) -> None: ...

    async def aclose(self) -> None: ...


class MemoryLimits:
    def __init__(self) -> None:
        self._open: dict[str, int] = {}
        self._tat: dict[str, float] = {}  # GCRA's theoretical arrival time, per client

    async def enter(self, client: str, max_concurrent: int | None, rpm: int | None) -> float | None:
        if max_concurrent is not None and self._open.get(client, 0) >= max_concurrent:
            return 1.0
        if rpm is not None:
            now = time.monotonic()
            interval = 60.0 / rpm
            tat = max(self._tat.get(client, now), now) + interval
            if tat - now > BURST_S:
                return tat - now - BURST_S
            self._tat[client] = tat
        self._open[client] = self._open.get(client, 0) + 1
        return None

    async def leave(self, client: str) -> None:
        self._open[client] = max(0, self._open.get(client, 0) - 1)

    async def aclose(self) -> None:
        return None


# One round trip, atomic across replicas; Redis's clock, so replicas need not agree on time.
# A count is read by `num`: a key that holds anything but a number in +-1e15 (an integer for
# the open count: INCR takes no other), a string written by hand or another type, is deleted
# and read as absent; it once raised out of the script, a 500
# for every limited client on every replica.
_NUM = """
local function num(key, absent, whole)
  local n = tonumber(redis.pcall('GET', key))
  if n == nil or n ~= n or n > 1e15 or n < -1e15 or (whole and n ~= math.floor(n)) then
    redis.call('DEL', key)
    return absent
  end
  return n
end
"""
_ENTER = (
    _NUM
    + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max_open = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local open = num(KEYS[2], 0, true)
if max_open > 0 and open >= max_open then
  return 1000
end
if interval > 0 then
  local tat = num(KEYS[1], now)
  if tat < now then tat = now end
  tat = tat + interval
  if tat - now > burst then return tat - now - burst end
  redis.call('SET', KEYS[1], tat, 'PX', math.ceil(tat - now) + 1000)
end
redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], 3600000)
return -1
"""
)
_LEAVE = (
    _NUM
    + """
if num(KEYS[1], 0, true) > 0 then redis.call('DECR', KEYS[1]) end
return 0
"""
)


class RedisLimits:
    """The same limits in Redis. The open-request count expires an hour after its last
    change, so a replica that dies with requests open cannot block a client for good."""

    def __init__(
        self,
        url: str,
        prefix: str = "specrouter",
        errors: Counter | None = None,
        client: Any = None,
    ) -> None:
        import redis.asyncio as aioredis

        self._redis: Any = client or aioredis.Redis.from_url(
            url, socket_timeout=IO_TIMEOUT_S, socket_connect_timeout=IO_TIMEOUT_S
        )
        self._prefix = prefix
        self._enter = self._redis.register_script(_ENTER)
        self._leave = self._redis.register_script(_LEAVE)
        self._local = MemoryLimits()  # while Redis fails
        self._local_open: dict[str, int] = {}  # requests admitted by the local counts
        self._retry_at = 0.0  # monotonic: Redis is not asked before
        self._errors = errors

    def _keys(self, client: str) -> list[str]:
        return [f"{self._prefix}:rate:{client}", f"{self._prefix}:open:{client}"]

    def _failed(self, op: str, exc: BaseException) -> None:
        if self._errors is not None:
            self._errors.labels(op).inc()
        if time.monotonic() >= self._retry_at:  # once per outage, not per request
            log.warning(
                "Redis limits %s failed (%s: %s): limits counted by this replica for %gs",
                op,
                type(exc).__name__,
                exc,
                RETRY_AFTER_S,
            )
        self._retry_at = time.monotonic() + RETRY_AFTER_S

    async def enter(self, client: str, max_concurrent: int | None, rpm: int | None) -> float | None:
        if max_concurrent is None and rpm is None:
            return None
        if time.monotonic() >= self._retry_at:
            interval_ms = 0 if rpm is None else 60_000 / rpm
            try:
                async with asyncio.timeout(IO_TIMEOUT_S * 2):
                    wait_ms = await self._enter(
                        keys=self._keys(client),
                        args=[max_concurrent or 0, interval_ms, BURST_S * 1000],
                    )
                wait = int(wait_ms)
            except Exception as exc:  # noqa: BLE001 - away, hung, or not our value: local counts
                self._failed("enter", exc)
            else:
                return None if wait < 0 else wait / 1000
        wait_s = await self._local.enter(client, max_concurrent, rpm)
        if wait_s is None:
            self._local_open[client] = self._local_open.get(client, 0) + 1
        return wait_s

    async def leave(self, client: str) -> None:
        local = self._local_open.get(client, 0)
        if local > 0:
            if local == 1:
                del self._local_open[client]
            else:
                self._local_open[client] = local - 1
            await self._local.leave(client)
            return
        try:
            async with asyncio.timeout(IO_TIMEOUT_S * 2):
                await self._leave(keys=self._keys(client)[1:])
        except Exception as exc:  # noqa: BLE001 - the count expires an hour after its change
            self._failed("leave", exc)

    async def aclose(self) -> None:
        await self._redis.aclose()
