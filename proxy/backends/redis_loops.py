"""The background loops that share a replica's state through Redis, off the request path: the
session table (proxy/backends/session_share.py) and admission's residency
(proxy/backends/residency_share.py).

Each loop runs one round trip every `interval`; a failure (Redis away, or hung past
`IO_TIMEOUT_S * 2`) is counted in `specrouter_session_share_errors_total{op=...}` and the loop
retries with a doubling backoff, at most `MAX_BACKOFF_S`, back to `interval` on the first
success. Closing cancels the loops, then closes the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from prometheus_client import Counter

IO_TIMEOUT_S: Final = 2.0  # a Redis that hangs counts as away
MAX_BACKOFF_S: Final = 10.0


class RedisLoops:
    """Background loops against one Redis client; subclasses set the three attributes."""

    _redis: Any
    _errors: Counter
    _tasks: list[asyncio.Task[None]]

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._redis.aclose()

    async def _every(self, interval: float, op: str, once: Callable[[], Awaitable[int]]) -> None:
        backoff = interval
        while True:
            await asyncio.sleep(backoff)
            try:
                await asyncio.wait_for(once(), IO_TIMEOUT_S * 2)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any Redis failure: decide locally, retry
                self._errors.labels(op).inc()
                self._failed(op, exc)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            self._reached()
            backoff = interval

    def _failed(self, op: str, exc: Exception) -> None:
        """After a failed round trip of `op` (counted already)."""

    def _reached(self) -> None:
        """After a round trip that succeeded."""
