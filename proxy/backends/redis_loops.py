"""The background loops that share a replica's state through Redis, off the request path: the
session table (proxy/backends/session_share.py) and admission's residency
(proxy/backends/residency_share.py).

Each loop runs one round trip every `interval`; a failure (Redis away, or hung past
`IO_TIMEOUT_S * 2`) is counted in `specrouter_session_share_errors_total{op=...}` and the loop
retries with a doubling backoff, at most `MAX_BACKOFF_S`, back to `interval` on the first
success. Redis counts as reached again only after a round trip that was made (a step may have
nothing to send: it returns None) and began after the last failure: an empty flush, or a pull
answered just before Redis went, once logged "reachable again" between two failures of one
outage. Closing cancels the loops (a cancel a library took for an error is raised again:
`raise_if_cancelled`), then closes the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from prometheus_client import Counter

IO_TIMEOUT_S: Final = 2.0  # a Redis that hangs counts as away
CLOSE_S: Final = 5.0  # the most a replica's close waits for its loops, then for the client
MAX_BACKOFF_S: Final = 10.0


class RedisLoops:
    """Background loops against one Redis client; subclasses set the three attributes."""

    _redis: Any
    _errors: Counter
    _tasks: list[asyncio.Task[None]]
    _failed_at = float("-inf")  # when the last round trip failed (monotonic)

    async def aclose(self) -> None:
        """Cancel the loops, then close the client; bounded, so a replica always closes: a
        cancel the library swallowed is sent again, and a loop still running after
        `CLOSE_S` (or a client that hangs on close) is left to the process's end."""
        pending = {task for task in self._tasks if not task.done()}
        deadline = time.monotonic() + CLOSE_S
        while pending and time.monotonic() < deadline:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.1)
        for task in self._tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: a loop's end is no error of the close
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CLOSE_S):
                await self._redis.aclose()

    async def _every(
        self,
        interval: float,
        op: str,
        once: Callable[[], Awaitable[int | None]],
        first_s: float | None = None,
    ) -> None:
        """`once` every `interval`, the first after `first_s` (default: `interval`)."""
        backoff = interval if first_s is None else first_s
        while True:
            await asyncio.sleep(backoff)
            began = time.monotonic()
            try:
                # asyncio.timeout, not wait_for: 3.11's wait_for drops a cancel that arrives as
                # `once` completes (an empty flush completes at once), and the closing replica
                # then waited for this loop forever.
                async with asyncio.timeout(IO_TIMEOUT_S * 2):
                    done = await once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - any Redis failure: decide locally, retry
                raise_if_cancelled(exc)
                self._errors.labels(op).inc()
                self._failed_at = time.monotonic()
                self._failed(op, exc)
                backoff = min(max(backoff, interval) * 2, MAX_BACKOFF_S)
                continue
            raise_if_cancelled(None)  # a cancel redis-py's wait_for took, with no error
            if done is not None and began > self._failed_at:
                self._reached()
            backoff = interval

    def _failed(self, op: str, exc: Exception) -> None:
        """After a failed round trip of `op` (counted already)."""

    def _reached(self) -> None:
        """After a round trip that succeeded."""


def raise_if_cancelled(exc: Exception | None) -> None:
    """Raise the cancel that a library turned into `exc`. 3.11's wait_for, which redis-py wraps
    around its socket writes, returns the inner outcome when a cancel arrives as the write
    fails: the loop took a connection error for an outage and went on, and the closing
    replica waited for it forever. The task still counts the request (`Task.cancelling`);
    only `aclose` cancels these loops."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError from exc
