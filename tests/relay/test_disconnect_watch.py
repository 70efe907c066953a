"""DisconnectWatch both ways: our server's connection calling back, and `receive()` on any
other ASGI server. Either way the pending upstream call is cancelled and the response closed.
(The end-to-end aborts, through the real gateway, are in test_gateway_relay and test_faults.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from proxy.relay.watch import DisconnectWatch


class Response:
    closed = False

    def close(self) -> None:
        self.closed = True


class Hook:
    def __init__(self, gone: bool = False) -> None:
        self.gone = gone
        self.callback: Callable[[], None] | None = None

    def on_lost(self, callback: Callable[[], None] | None) -> None:
        self.callback = callback


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()
    raise AssertionError


async def test_the_connection_calls_back() -> None:
    hook = Hook()
    watch = DisconnectWatch(_never, hook)
    watch.pending = asyncio.ensure_future(asyncio.sleep(10))
    assert hook.callback is not None and not watch.gone
    hook.callback()
    await asyncio.sleep(0)
    assert watch.gone and watch.pending.cancelled()
    watch.stop()
    assert hook.callback is None  # the next request on the connection starts clean


async def test_a_client_gone_before_the_watch_starts_is_seen() -> None:
    watch = DisconnectWatch(_never, Hook(gone=True))
    assert watch.gone
    watch.stop()


async def test_receive_disconnect_on_other_servers() -> None:
    messages = asyncio.Queue[dict[str, Any]]()
    watch = DisconnectWatch(messages.get)
    response = Response()
    watch.response = response
    await messages.put({"type": "http.request", "body": b"", "more_body": False})
    await messages.put({"type": "http.disconnect"})
    for _ in range(5):
        await asyncio.sleep(0)
    assert watch.gone and response.closed
    watch.stop()


async def test_wait_ends_when_the_client_leaves_and_leaves_the_task_clean() -> None:
    hook = Hook()
    watch = DisconnectWatch(_never, hook)
    started = asyncio.Event()

    async def upstream_call() -> None:
        started.set()
        await asyncio.Event().wait()

    async def request() -> int:
        try:
            await watch.wait(upstream_call())
        except asyncio.CancelledError:
            assert watch.gone
        task = asyncio.current_task()
        assert task is not None
        await asyncio.sleep(0)  # not cancelled again: the cancellation was taken back
        return task.cancelling()

    task = asyncio.ensure_future(request())
    await started.wait()
    assert hook.callback is not None
    hook.callback()
    assert await task == 0
    assert watch.pending is None
    assert await watch.wait(asyncio.sleep(0, "answer")) == "answer"
    watch.stop()
