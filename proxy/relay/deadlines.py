"""Deadlines of one length for many requests, on one loop timer: the first-byte timeout of the
requests waiting on an engine, the write timeout of a stream's last event.

Deadlines of one length come in the order they start: a queue holds them oldest first, and one
timer, armed for the oldest, serves them all. An `asyncio.timeout` per request made and
cancelled a timer per request: 42 us of a request on its way to the engine once other work has
taken the caches, as between a gateway's requests, against 21 us here (start and end; an empty
coroutine 5), as a deadline that ends in time is only marked: it leaves the queue when it
reaches the front.

An expired deadline cancels its task, as `asyncio.timeout` does; `expired(deadline)` in the
task's `except CancelledError` tells that cancellation from any other (the client leaving).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

# A timer may fire up to a millisecond early (libuv's clock is in ms): a deadline that close
# is due, not re-armed for the few microseconds left.
_EARLY = 0.001


class Deadline:
    __slots__ = ("at", "task", "cancelling", "fired")

    def __init__(self, at: float, task: asyncio.Task[Any] | None) -> None:
        self.at = at
        self.task = task  # None once ended: in time, or fired
        self.cancelling = 0 if task is None else task.cancelling()  # others' cancels before it
        self.fired = False


class Deadlines:
    """`start()` in the waiting task, `end(deadline)` in its `finally`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._queue: deque[Deadline] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    def __len__(self) -> int:
        return len(self._queue)

    def start(self) -> Deadline:
        loop = asyncio.get_running_loop()
        deadline = Deadline(loop.time() + self.seconds, asyncio.current_task())
        self._queue.append(deadline)
        if self._timer is None or self._loop is not loop:  # a loop's timer never fires in another
            self._loop = loop
            self._timer = loop.call_at(deadline.at, self._fire)
        return deadline

    def end(self, deadline: Deadline) -> None:
        deadline.task = None
        queue = self._queue
        while queue and queue[0].task is None:  # the ended ones at the front leave now
            queue.popleft()

    def expired(self, deadline: Deadline) -> bool:
        """In the task's `except CancelledError`: whether the cancellation is the deadline's
        alone (then taken back, so the task can raise a timeout instead); False when another
        cancellation is pending too, which must go on."""
        task = asyncio.current_task()
        return deadline.fired and task is not None and task.uncancel() <= deadline.cancelling

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        loop = asyncio.get_running_loop()
        due = loop.time() + _EARLY
        queue = self._queue
        while queue and (queue[0].task is None or queue[0].at <= due):
            deadline = queue.popleft()
            task = deadline.task
            if task is not None:
                deadline.task, deadline.fired = None, True
                task.cancel()
        if queue:
            self._timer = loop.call_at(queue[0].at, self._fire)
