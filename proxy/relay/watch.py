"""The client's disconnect, noticed while the gateway waits on an engine or relays its answer.

uvicorn's `send` goes quiet rather than failing once the client is gone, so a watcher ends the
upstream call instead: vLLM then aborts the generation at once, not at the next chunk.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import aiohttp

from proxy.relay.asgi import Receive

T = TypeVar("T")


class _Closable(Protocol):
    def close(self) -> None: ...


def _close(response: _Closable, reason: str) -> None:
    """Close an upstream response, waking a pending read with an exception of its own.

    aiohttp wakes a reader interrupted by close() with one module-level exception whose
    traceback grows with every raise, keeping each request's frames alive for good.
    """
    content = getattr(response, "content", None)
    if content is not None and hasattr(content, "set_exception"):
        content.set_exception(aiohttp.ClientConnectionError(reason))
    response.close()


class LostHook(Protocol):
    """Our server's connection (proxy/relay/channel.py's PushChannel): it calls back when it closes."""

    @property
    def gone(self) -> bool: ...
    def on_lost(self, callback: Callable[[], None] | None) -> None: ...


class DisconnectWatch:
    """Notices the client leaving once the request body is read, and then cancels the pending
    upstream call or closes the upstream response, so vLLM aborts the generation at once
    instead of at the next chunk.

    On our own server the connection calls back when it closes (`hook`); on any other ASGI
    server a task listens on `receive()` for `http.disconnect`.
    """

    __slots__ = ("gone", "closing", "response", "pending", "_task", "_hook")

    def __init__(self, receive: Receive, hook: LostHook | None = None) -> None:
        self.gone = False
        self.closing: str | None = None  # set when the gateway itself ends the stream
        self.response: _Closable | None = None  # the upstream response being relayed
        self.pending: asyncio.Future[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._hook = hook
        if hook is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(receive))
        elif hook.gone:
            self.gone = True  # it left while the body was being read
        else:
            hook.on_lost(self._lost)

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        self._lost()

    def _lost(self) -> None:
        self.gone = True
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()
        if self.response is not None:
            _close(self.response, "client gone")

    async def wait(self, aw: Awaitable[T]) -> T:
        """Await an upstream call (admission, connect, first byte) that the client's leaving
        cancels at once: the request's own task is cancelled (no task per call, no loop turn
        to start one), and its cancellation taken back once raised, so the caller sees
        CancelledError with `gone` set and the task is not left marked cancelling."""
        task = asyncio.current_task()
        self.pending = task
        try:
            return await aw
        except asyncio.CancelledError:
            if self.gone and task is not None and task.cancelling():
                task.uncancel()
            raise
        finally:
            self.pending = None

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._hook is not None:
            self._hook.on_lost(None)

    def close_upstream(self, reason: str) -> None:
        """End the relay from outside (shutdown deadline): the client gets an error event."""
        self.closing = reason
        if self.response is not None:
            _close(self.response, reason)
