"""The push relay's engine side: streaming requests on kept-alive HTTP/1.1 connections.

A connection per request cost, at 16 paced streams, ~13 us of CPU per relayed chunk: the
connect and close on both ends, and a fresh connection's quick-ACK phase (one ACK per chunk).
So a finished response hands its connection back to `EnginePool`, and the next request to the
same engine reuses it. A response that did not finish (client gone, error, timeout) closes its
connection: that is how vLLM learns to abort the generation.

An idle connection is kept `max_idle_s` (2 s; vLLM's uvicorn closes idle ones after 5 s). If
the engine closed a reused connection all the same, the request is sent again on a new one:
no byte of an answer had come (an engine closing an idle connection does not read what
arrives on it), the same rule as the retries before the first byte.

What an engine sends is bounded and checked: a response head past `max_head_bytes` fails the
response (counted per read and per head, so one read holding a whole large head is caught);
bytes after a response, or on an idle connection, close the connection (its framing is lost:
they would otherwise be read as the next request's answer) and stop reuse of that engine's
connections; a connection is reused only after an answer that echoed the request's id (vLLM's
`--enable-request-id-headers`; without it a late answer on a reused connection cannot be told
from the next request's); and an answer whose
echoed `x-request-id` (vLLM's `--enable-request-id-headers`) is not the request's is dropped,
and the request sent again on a fresh connection when it came on a reused one.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

from proxy.relay.upstream import Payload, UpstreamError, describe, echo_mismatch, head_size

Key = tuple[str, str, int]  # scheme, host, port


class EngineConnection(asyncio.Protocol):
    """One connection to an engine; it carries one response at a time."""

    def __init__(self, pool: EnginePool, key: Key) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.stream: EngineStream | None = None
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.stream is not None:
            self.stream.feed(data)
        else:  # bytes nobody asked for: this connection's framing is lost
            self.pool.distrust(self.key)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.discard(self)
        if self.stream is not None:
            self.stream.lost()

    @property
    def usable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class EngineStream:
    """One streaming response from an engine (an `UpstreamResponse`, proxy/relay/upstream.py).

    The body is kept until a sink is attached, then pushed to the sink as it arrives. `head`
    resolves with the status line and headers, `first` with the first body bytes, `done` when
    the response is complete; all three fail when the connection breaks first.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, conn: EngineConnection) -> None:
        self._loop = loop
        self._conn: EngineConnection | None = conn
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers: dict[str, str] = {}
        self.head: asyncio.Future[None] = loop.create_future()
        self.first: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()
        self.pending: list[bytes] = []
        self.sink: Callable[[bytes], None] | None = None
        self.last_activity = loop.time()
        self.received = 0  # bytes of this response so far
        self._paused = False
        self._complete = False
        self._keep_alive = False
        self.max_head = conn.pool.max_head_bytes
        self.request_id: str | None = None  # the id sent, which the engine should echo

    # from the connection
    def feed(self, data: bytes) -> None:
        self.last_activity = self._loop.time()
        self.received += len(data)
        parser = self._parser
        if parser is None:  # finished: bytes for no one (the connection is closed or released)
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.abort(UpstreamError("connect", "engine answered with an upgrade"))
        except httptools.HttpParserCallbackError as exc:
            if "head larger than" in str(exc):
                self.abort(UpstreamError("protocol", str(exc)))
            else:
                self.abort(UpstreamError("connect", f"engine sent invalid HTTP: {exc}"))
        except httptools.HttpParserError as exc:
            self.abort(UpstreamError("connect", f"engine sent invalid HTTP: {exc}"))
        else:
            if self._complete:
                self._release()
            elif not self.head.done() and self.received > self.max_head:
                # Checked after the read: one read may hold a small head and a large body.
                self.abort(
                    UpstreamError(
                        "protocol", f"engine response head larger than {self.max_head} bytes"
                    )
                )

    def lost(self) -> None:
        self._conn = None
        self._fail(UpstreamError("connect", "engine connection lost"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        if self._complete:  # a second answer to one request: stop; the connection is not reused
            if self._conn is not None:
                self._conn.pool.distrust(self._conn.key)
            raise ValueError("engine sent bytes after the response")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # the parser calls this while it parses
        self.status = self._parser.get_status_code()
        self.headers = {
            k.decode("latin-1").lower(): v.decode("latin-1") for k, v in self.raw_headers
        }
        if head_size(self.raw_headers) > self.max_head:
            # A whole head in one read is never seen by `feed`'s check: its size is its own.
            raise ValueError(f"engine response head larger than {self.max_head} bytes")
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._conn is None:
            return  # given up on (the rest of a read that failed it): nobody reads it
        if self.sink is not None:
            self.sink(body)
        else:
            self.pending.append(body)
            if not self.first.done():
                self.first.set_result(None)

    def on_message_complete(self) -> None:
        self._complete = True
        assert self._parser is not None
        # Only valid in this callback. An answer without the request's id echoed cannot be told
        # apart from a late one on a reused connection: its connection is not reused.
        self._keep_alive = self._parser.should_keep_alive() and self._echoed()
        for fut in (self.head, self.first, self.done):
            if not fut.done():
                fut.set_result(None)

    def _echoed(self) -> bool:
        return self.request_id is None or self.headers.get("x-request-id") == self.request_id

    # control
    def _fail(self, exc: Exception) -> None:
        for fut in (self.head, self.first, self.done):
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()  # retrieved: nobody may be waiting on all three

    def _release(self) -> None:
        """The response is complete: its connection goes back to the pool, or is closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.stream = None
        if self._paused and conn.transport is not None:
            conn.transport.resume_reading()
        if self._keep_alive:
            conn.pool.put(conn)
        else:
            conn.close()

    async def first_bytes(self) -> bytes:
        """The first body bytes (the caller bounds the wait: connect, head and these share
        one first-byte timeout)."""
        if not self.pending:
            await self.first
        first = self.take_pending()
        if not first and self.status == 200:
            raise UpstreamError("connect", "backend closed the response before the first byte")
        return first

    def whole(self) -> bool:
        """Not read ahead here: a non-streaming body is checked by its first bytes."""
        return False

    def finish(self, ok: bool) -> None:
        """The relay is over: a complete response has already released its connection."""
        self.close()
        # Nothing reads the stream now. The parser calls back into it (a cycle, freed only by a
        # full collection) and the sink holds the client's connection: both go at once.
        self.sink = None
        self._parser = None

    def take_pending(self) -> bytes:
        data, self.pending = b"".join(self.pending), []
        return data

    def attach(self, sink: Callable[[bytes], None]) -> None:
        self.sink = sink

    def pause(self) -> None:
        conn = self._conn
        if not self._paused and conn is not None and conn.transport is not None:
            self._paused = True
            conn.transport.pause_reading()

    def resume(self) -> None:
        conn = self._conn
        if self._paused and conn is not None and conn.usable:
            self._paused = False
            assert conn.transport is not None
            conn.transport.resume_reading()

    def close(self) -> None:
        """Give up on the response: a complete one has already released its connection; an
        unfinished one closes it, which tells the engine to abort the generation."""
        self.abort(UpstreamError("connect", "engine connection closed"))

    def abort(self, exc: UpstreamError) -> None:
        """`close`, failing what waits on the response with `exc`."""
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.stream = None
            conn.close()
            self._fail(exc)


class EnginePool:
    """Idle kept-alive connections to engines, by (scheme, host, port); the gateway owns one.

    `https` engines (vLLM with `--ssl-keyfile`) are verified against the system's trust store,
    as the aiohttp client does (`SSL_CERT_FILE` points both at a private CA), unless `tls`
    gives another context.
    """

    def __init__(
        self,
        *,
        max_idle_s: float = 2.0,
        max_idle_per_engine: int = 256,
        max_head_bytes: int = 64 * 1024,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._tls = tls
        self.max_head_bytes = max_head_bytes
        self.max_idle_s = max_idle_s
        self.max_idle_per_engine = max_idle_per_engine
        self._idle: dict[Key, list[EngineConnection]] = {}
        # Engines that sent an answer nobody asked for: without an x-request-id echo, a late
        # one could be read as the next request's answer, so their connections are not reused.
        self._distrusted: set[Key] = set()
        self._sweep: asyncio.TimerHandle | None = None

    def take(self, key: Key, now: float) -> EngineConnection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()  # the most recently used: the least likely to be timed out
            if conn.usable and now - conn.idle_since < self.max_idle_s:
                return conn
            conn.close()
        return None

    def put(self, conn: EngineConnection) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if not conn.usable or len(idle) >= self.max_idle_per_engine or conn.key in self._distrusted:
            conn.close()
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        idle.append(conn)
        if self._sweep is None:  # one timer for the pool, not one per connection
            self._sweep = loop.call_later(self.max_idle_s, self._expire)

    def _expire(self) -> None:
        """Close what has been idle too long, so a quiet gateway holds no engine sockets."""
        self._sweep = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        for idle in self._idle.values():
            while idle and now - idle[0].idle_since >= self.max_idle_s:  # oldest first
                idle.pop(0).close()
        if any(self._idle.values()):
            self._sweep = loop.call_later(self.max_idle_s / 2, self._expire)

    def distrust(self, key: Key) -> None:
        """No connection to this engine is kept for reuse from now on (bounded: one entry per
        engine address the policy names)."""
        if len(self._distrusted) < 4096:
            self._distrusted.add(key)
        for conn in self._idle.pop(key, []):
            conn.close()

    def discard(self, conn: EngineConnection) -> None:
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    def tls(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    def idle_count(self) -> int:
        return sum(len(v) for v in self._idle.values())

    def close(self) -> None:
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


async def open_engine_stream(
    pool: EnginePool,
    url: str,
    payload: bytes | Payload,
    headers: dict[str, str],
    connect_timeout: float,
    sent: list[bool] | None = None,
) -> EngineStream:
    """Send the request (on a kept-alive connection when one is idle); wait for the head.
    `payload`: the body, or its pieces (written one after the other, none copied). `sent`
    gets True once the request is written: from then on the engine has it."""
    pieces = (payload,) if isinstance(payload, bytes) else tuple(payload)
    key, start = _target(url)
    lines = [start, f"content-length: {sum(map(len, pieces))}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")  # the body not copied after it
    loop = asyncio.get_running_loop()
    while True:
        conn = pool.take(key, loop.time())
        reused = conn is not None
        if conn is None:
            conn = await _connect(pool, key, connect_timeout)
        stream = EngineStream(loop, conn)
        stream.request_id = headers.get("x-request-id")
        conn.stream = stream
        assert conn.transport is not None
        conn.transport.writelines((head, *pieces))
        if sent is not None:
            sent.append(True)
        try:
            await stream.head
        except UpstreamError:
            stream.close()
            if reused and stream.received == 0:
                continue  # the engine had closed it while idle: it never saw this request
            raise
        except BaseException:
            stream.close()
            raise
        mismatch = echo_mismatch(stream.headers, headers)
        if mismatch is not None:
            stream.close()
            if reused:
                continue  # an answer left over on the connection: ask again on a fresh one
            raise mismatch
        return stream


@functools.lru_cache(maxsize=256)
def _target(url: str) -> tuple[Key, str]:
    """An engine URL's connection key and request line with its Host header, parsed once per
    URL (the policy's engines times the API paths), not per request."""
    parts = urlsplit(url)
    scheme = parts.scheme or "http"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if scheme == "https" else 80)
    # Never userinfo in the Host header (policy URLs refuse it; this holds for any caller).
    start = f"POST {parts.path or '/'} HTTP/1.1\r\nhost: {parts.netloc.rpartition('@')[2]}"
    return (scheme, host, port), start


async def _connect(pool: EnginePool, key: Key, timeout: float) -> EngineConnection:
    conn = EngineConnection(pool, key)
    scheme, host, port = key
    tls = pool.tls() if scheme == "https" else None
    try:
        async with asyncio.timeout(timeout):
            await asyncio.get_running_loop().create_connection(
                lambda: conn, host, port, ssl=tls, server_hostname=host if tls else None
            )
    except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError: a bad certificate too
        raise UpstreamError("connect", describe(exc)) from exc
    return conn
