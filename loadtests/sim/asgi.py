"""ASGI pieces of the simulated server: JSON and SSE responses, simulated crashes.

Streams are written by `SSEResponse`, a small ASGI response that watches for `http.disconnect`
(a client that goes away aborts its sequences, as vLLM does) and can drop the connection without
a proper end (the `die_mid_stream` fault). With `keep_alive` (`--sse-keep-alive-interval`, as
vLLM 0.29+) a stream silent for that long gets a `: keep-alive` comment frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from proxy.vllm_wire import KEEP_ALIVE_COMMENT, Json

TRANSPORT_KEY = "specrouter.transport"


class SimulatedCrash(Exception):
    """Raised to make the ASGI server drop a connection when no transport is at hand."""


def json_response(body: Json, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


async def drop_connection(scope: Scope) -> None:
    """Close the TCP connection now, with no (further) response bytes: a crashed server."""
    transport = scope.get(TRANSPORT_KEY)
    if transport is None:
        raise SimulatedCrash("connection dropped by the die_mid_stream fault")
    transport.abort()
    # Let the server see the connection go before the app returns, so it does not complain that
    # the response was never completed.
    for _ in range(3):
        await asyncio.sleep(0)


class DropResponse(Response):
    """A 'response' that closes the connection without sending anything."""

    def __init__(self) -> None:
        super().__init__(status_code=500)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await drop_connection(scope)


FrameSource = AsyncIterator[list[bytes]]


class SSEResponse(Response):
    """Streams SSE frames; aborts the engine request when the client disconnects."""

    media_type = "text/event-stream"

    def __init__(
        self,
        frames: FrameSource,
        *,
        on_disconnect: Callable[[], None],
        on_drop: Callable[[], None],
        drop_after: Callable[[], int | None],
        keep_alive: float | None = None,
    ) -> None:
        self.frames = frames
        self.keep_alive = keep_alive
        self._next: asyncio.Future[list[bytes]] | None = None  # the frames awaited, keep_alive
        self.on_disconnect = on_disconnect
        self.on_drop = on_drop
        self.drop_after = drop_after
        self.status_code = 200
        self.background = None
        self.init_headers(None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.drop_after() == 0:
            self.on_drop()
            await drop_connection(scope)
            return
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    self.on_disconnect()
                    return

        watcher = asyncio.get_running_loop().create_task(watch())
        sent = 0
        try:
            while (frames := await self._take()) is not None:
                limit = self.drop_after()
                if limit is not None and sent + len(frames) > limit:
                    # The engine "dies" mid-stream: what was sent stays sent, then the socket goes.
                    head = frames[: max(0, limit - sent)]
                    if head:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": b"".join(head),
                                "more_body": True,
                            }
                        )
                    self.on_drop()
                    await drop_connection(scope)
                    return
                await send(
                    {"type": "http.response.body", "body": b"".join(frames), "more_body": True}
                )
                sent += len(frames)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            if self._next is not None:  # the generator must not be running when it is closed
                self._next.cancel()
                await asyncio.wait({self._next})
            aclose = getattr(self.frames, "aclose", None)
            if aclose is not None:
                await aclose()

    async def _take(self) -> list[bytes] | None:
        """The next frames, or a keep-alive comment when they take `keep_alive` seconds."""
        try:
            if self.keep_alive is None:
                return await anext(self.frames)
            if self._next is None:
                self._next = asyncio.ensure_future(anext(self.frames))
            done, _ = await asyncio.wait({self._next}, timeout=self.keep_alive)
            if not done:
                return [KEEP_ALIVE_COMMENT]
            task, self._next = self._next, None
            return task.result()
        except StopAsyncIteration:
            return None
