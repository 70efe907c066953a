"""The shared-state loops end when closed, whatever the Redis client makes of the cancel."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, Counter

from proxy.backends.redis_loops import RedisLoops


class _Client:
    closed = False

    async def aclose(self) -> None:
        self.closed = True


class _Loops(RedisLoops):
    def __init__(self) -> None:
        self._redis = _Client()
        self._errors = Counter("errors", "", ["op"], registry=CollectorRegistry())
        self._tasks = []
        self.rounds = 0

    async def swallowing(self) -> int:
        """A round trip whose client turns the cancel into its own error, as redis-py's writes
        do under 3.11's wait_for."""
        self.rounds += 1
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            raise ConnectionError("Error UNKNOWN while writing to socket.") from None
        return 1

    async def nothing(self) -> int | None:
        self.rounds += 1
        return None  # nothing to send: no await at all


@pytest.mark.parametrize("step", ["swallowing", "nothing"])
async def test_close_ends_the_loop(step: str) -> None:
    loops = _Loops()
    loops._tasks = [
        asyncio.get_running_loop().create_task(loops._every(0.001, "op", getattr(loops, step)))
    ]
    while loops.rounds < 1:  # the swallowing step is now in its round trip
        await asyncio.sleep(0.001)
    (task,) = loops._tasks
    task.cancel()  # what aclose does first
    await asyncio.wait([task], timeout=2)
    assert task.cancelled()  # it once looped on: the closing replica waited forever
    await loops.aclose()
    assert loops._redis.closed
    assert loops._errors.labels("op")._value.get() == 0  # a cancel is no Redis failure
