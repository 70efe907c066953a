"""The push relay: engine bytes written to the client from the read callback itself.

The pull loop (proxy/relay.py) costs, per relayed chunk, a future and a task wake-up for the
upstream read, aiohttp's payload machinery and an ASGI `send` round trip; at 16 paced streams
that is ~150 us of CPU per chunk on the 2-core box, against ~40 us for nginx. Here the engine's
stream is read by a raw asyncio protocol (httptools parses the response), and each read is
framed, filtered and written to the client's transport inside `data_received`: no task runs
per chunk. Backpressure is explicit: when the client's transport pauses writing, the engine's
transport pauses reading.

Two halves: `PushChannel`, an ASGI extension that our server protocol (proxy/servers.py) puts in
the scope (`scope["extensions"]["specrouter.push"]`) to write chunked body bytes straight to the
client's transport after the response start went through ASGI; and `EngineStream`, one
streaming request to an engine on its own connection. Without the extension (another ASGI
server) the gateway uses the pull loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

import httptools

from proxy import sse
from proxy.errors import sse_error_event
from proxy.relay import RESPONSES_ENDS, _ended, check_end, end_stream, filter_read
from proxy.upstream import UpstreamError


class PushChannel:
    """Write access to one client connection, for the response in progress."""

    __slots__ = ("_protocol",)

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol  # uvicorn's HttpToolsProtocol (our subclass)

    @property
    def gone(self) -> bool:
        cycle = self._protocol.cycle
        return cycle is None or cycle.disconnected or self._protocol.transport.is_closing()

    @property
    def paused(self) -> bool:
        return bool(self._protocol.flow.write_paused)

    async def drain(self) -> None:
        await self._protocol.flow.drain()

    def write(self, data: bytes) -> None:
        """One chunk of the chunked body (the response start went out through ASGI)."""
        if not self.gone:
            self._protocol.transport.write(b"%x\r\n%b\r\n" % (len(data), data))


Sink = Callable[[bytes], None]


class EngineStream(asyncio.Protocol):
    """One streaming HTTP/1.1 request to an engine, on a connection of its own (closed after).

    The response body is kept until a sink is attached, then pushed to the sink as it arrives.
    `done` resolves when the response is complete, or fails when the connection breaks.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] = loop.create_future()
        self.first: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.pending: list[bytes] = []
        self.sink: Sink | None = None
        self.last_activity = loop.time()
        self._paused = False

    # asyncio protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.last_activity = self._loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(UpstreamError("connect", "engine answered with an upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(UpstreamError("connect", f"engine sent invalid HTTP: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(UpstreamError("connect", "engine connection lost"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1")
                        for k, v in self.raw_headers}
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink(body)
        else:
            self.pending.append(body)
            if not self.first.done():
                self.first.set_result(None)

    def on_message_complete(self) -> None:
        for fut in (self.head, self.first, self.done):
            if not fut.done():
                fut.set_result(None)
        self.close()

    # control
    def _fail(self, exc: Exception) -> None:
        for fut in (self.head, self.first, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting on all three

    def take_pending(self) -> bytes:
        data, self.pending = b"".join(self.pending), []
        return data

    def attach(self, sink: Sink) -> None:
        self.sink = sink

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.transport.is_closing():
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def open_engine_stream(url: str, payload: bytes, headers: dict[str, str],
                             connect_timeout: float) -> EngineStream:
    """Connect, send the request, and wait for the response head."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path or "/"
    loop = asyncio.get_running_loop()
    stream = EngineStream(loop)
    try:
        async with asyncio.timeout(connect_timeout):
            await loop.create_connection(lambda: stream, host, port)
    except (OSError, TimeoutError) as exc:
        raise UpstreamError("connect", f"{type(exc).__name__}: {exc}") from exc
    lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(payload)}",
             "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    assert stream.transport is not None
    stream.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
    try:
        await stream.head
    except BaseException:
        stream.close()
        raise
    return stream


async def relay_sse_push(stream: EngineStream, first: bytes, channel: PushChannel,
                         send: Callable[[dict[str, Any]], Any], watch: Any, filt: Any,
                         idle_timeout: float, ends: tuple[bytes, ...],
                         resume: Callable[[], Any] | None) -> str:
    """relay.relay_sse's contract (outcome, error event, continuation), pushed from callbacks."""
    m = filt.m
    loop = asyncio.get_running_loop()
    responses = ends is RESPONSES_ENDS
    while True:
        splitter = sse.FrameSplitter()  # a dead engine's partial frame is never sent
        ended = [False]
        draining: list[asyncio.Task[None]] = []

        def sink(data: bytes, stream: EngineStream = stream, splitter: Any = splitter,
                 ended: list[bool] = ended, draining: list[asyncio.Task[None]] = draining
                 ) -> None:
            t = time.perf_counter()
            out = filter_read(splitter, filt, data, t)
            if not out:
                return
            if m.t_first_byte is None:
                m.t_first_byte = t
            ended[0] = _ended(out, ends)
            channel.write(out)
            if channel.paused and not draining:
                # The client reads slower than the engine writes: stop reading the engine
                # until the client's socket drains (TCP then pushes back on the engine).
                stream.pause()
                draining.append(loop.create_task(_resume_after_drain(channel, stream, draining)))

        if first:
            sink(first)
        stream.attach(sink)
        pending = stream.take_pending()
        if pending:
            sink(pending)
        outcome, error = "ok", b""
        try:
            while not stream.done.done():
                remaining = stream.last_activity + idle_timeout - loop.time()
                if remaining <= 0 and not stream._paused:
                    raise TimeoutError
                await asyncio.wait({stream.done}, timeout=max(remaining, 0.05))
            stream.done.result()
        except TimeoutError:
            outcome = "timeout"
            error = sse_error_event(504, f"upstream sent nothing for {idle_timeout:g}s",
                                    responses=responses)
        except UpstreamError as exc:
            outcome = "upstream_error"
            if not watch.gone:
                status = 503 if watch.closing is not None else 502
                error = sse_error_event(status, watch.closing or f"upstream {exc}",
                                        responses=responses)
        finally:
            for task in draining:
                task.cancel()
            stream.close()
        if watch.gone or channel.gone:
            return "client_gone"
        outcome, error = check_end(outcome, error, ended[0], m, responses)
        if outcome != "ok" and resume is not None and watch.closing is None:
            resumed = await resume()
            resume = None  # once per request
            if resumed is not None:
                stream, first = resumed
                continue
        break
    return await end_stream(send, filt, outcome, error)


async def _resume_after_drain(channel: PushChannel, stream: EngineStream,
                              draining: list[asyncio.Task[None]]) -> None:
    try:
        await channel.drain()
        stream.last_activity = asyncio.get_running_loop().time()
        stream.resume()
    finally:
        draining.clear()


async def relay_body_push(stream: EngineStream, first: bytes, channel: PushChannel,
                          send: Callable[[dict[str, Any]], Any], watch: Any, m: Any,
                          idle_timeout: float) -> str:
    """A plain body (an engine's error answer to a streaming request), pushed as it comes."""
    copy = bytearray(first)

    def sink(data: bytes) -> None:
        if len(copy) < 1 << 20:
            copy.extend(data)
        channel.write(data)

    if first:
        channel.write(first)
    stream.attach(sink)
    pending = stream.take_pending()
    if pending:
        sink(pending)
    loop = asyncio.get_running_loop()
    try:
        while not stream.done.done():
            remaining = stream.last_activity + idle_timeout - loop.time()
            if remaining <= 0:
                return "timeout"  # the body is left unended: the client sees it broken
            await asyncio.wait({stream.done}, timeout=remaining)
        stream.done.result()
    except UpstreamError:
        return "client_gone" if watch.gone else "upstream_error"
    finally:
        stream.close()
    if m.t_first_byte is None:
        m.t_first_byte = time.perf_counter()
    m.record_body(bytes(copy))
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return "ok" if stream.status < 400 else "upstream_error"
