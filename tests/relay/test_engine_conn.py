"""The push relay's engine connections: kept alive between finished responses, closed on
unfinished ones, and a request that meets a connection the engine had closed is sent again.

The engine here is a scripted HTTP/1.1 server on loopback, so each test can say exactly how
the engine behaves with its connections (the sim and vLLM keep them alive like `keep_alive`).
"""

from __future__ import annotations

import asyncio
import gc
import ssl
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from proxy.certs import CertFiles, server_context
from proxy.relay.engine_conn import EnginePool, open_engine_stream
from proxy.relay.upstream import UpstreamError

SSE = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n%b\r\n"
BODY = b'data: {"n":1}\n\ndata: [DONE]\n\n'


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)


class Engine:
    """Counts connections and requests; `behaviour(n_on_conn)` says what to do with each."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0
        self.eof = asyncio.Event()  # a connection was closed by the gateway side
        self.mode = "keep_alive"
        self.hold = asyncio.Event()  # "stall": answer the head, then wait for this

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        on_conn = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                await reader.readexactly(length)
                self.requests += 1
                on_conn += 1
                if self.mode == "close_second" and on_conn == 2:
                    writer.close()  # as an engine closing an idle connection as it is reused
                    return
                if self.mode == "stall":
                    writer.write(SSE % b"" + b"%x\r\ndata: {}\n\n\r\n" % len(b"data: {}\n\n"))
                    await writer.drain()
                    if await reader.read(1) == b"":
                        self.eof.set()
                    return
                extra = b"connection: close\r\n" if self.mode == "close_header" else b""
                writer.write(SSE % extra + _chunked(BODY))
                if self.mode == "two_answers":
                    writer.write(SSE % b"" + _chunked(b'data: {"stray":1}\n\n'))
                await writer.drain()
                if extra:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.eof.set()


@asynccontextmanager
async def engine(tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[Engine, str]]:
    e = Engine()
    server = await asyncio.start_server(e.handle, "127.0.0.1", 0, ssl=tls)
    port = server.sockets[0].getsockname()[1]
    scheme = "https" if tls else "http"
    try:
        yield e, f"{scheme}://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()


async def _fetch(pool: EnginePool, url: str) -> bytes:
    stream = await open_engine_stream(pool, url, b"{}", {"content-type": "application/json"}, 2.0)
    try:
        await stream.done
        return stream.take_pending()
    finally:
        stream.close()


async def test_finished_responses_leave_their_connection_for_the_next_request() -> None:
    pool = EnginePool()
    async with engine() as (e, url):
        for _ in range(3):
            assert await _fetch(pool, url) == BODY
        assert (e.connections, e.requests) == (1, 3)
        assert pool.idle_count() == 1
    pool.close()


async def test_a_connection_closed_by_the_engine_while_reused_is_replaced() -> None:
    pool = EnginePool()
    async with engine() as (e, url):
        e.mode = "close_second"
        assert await _fetch(pool, url) == BODY
        assert await _fetch(pool, url) == BODY  # sent again on a new connection
        assert e.connections == 2
        assert e.requests == 3  # the one the closing connection swallowed, unanswered
    pool.close()


async def test_connection_close_from_the_engine_is_not_kept() -> None:
    pool = EnginePool()
    async with engine() as (e, url):
        e.mode = "close_header"
        assert await _fetch(pool, url) == BODY
        assert pool.idle_count() == 0
        assert await _fetch(pool, url) == BODY
        assert e.connections == 2
    pool.close()


async def test_bytes_after_the_response_make_the_connection_unusable() -> None:
    pool = EnginePool()
    async with engine() as (e, url):
        e.mode = "two_answers"
        assert await _fetch(pool, url) == BODY  # the answer itself is whole
        assert pool.idle_count() == 0
        e.mode = "keep_alive"
        assert await _fetch(pool, url) == BODY  # never the stray bytes
        assert e.connections == 2
    pool.close()


async def test_idle_connections_expire() -> None:
    pool = EnginePool(max_idle_s=0.05)
    async with engine() as (e, url):
        assert await _fetch(pool, url) == BODY
        assert pool.idle_count() == 1
        await asyncio.sleep(0.15)
        assert pool.idle_count() == 0  # closed by the pool's own timer, no request needed
        await asyncio.wait_for(e.eof.wait(), 2.0)
        assert await _fetch(pool, url) == BODY
        assert e.connections == 2
    pool.close()


async def test_an_unfinished_response_closes_its_connection() -> None:
    """What makes vLLM abort: the gateway gives up on a stream, the engine sees EOF."""
    pool = EnginePool()
    async with engine() as (e, url):
        e.mode = "stall"
        stream = await open_engine_stream(pool, url, b"{}", {}, 2.0)
        await stream.first
        stream.close()
        await asyncio.wait_for(e.eof.wait(), 2.0)
        assert pool.idle_count() == 0
        with pytest.raises(UpstreamError):
            await stream.done
    pool.close()


async def test_a_finished_stream_is_freed_without_the_cycle_collector() -> None:
    """The parser calls back into its stream, and the sink holds the client's connection:
    finish() breaks that cycle, so a relayed response goes at once, not at a full collection."""
    pool = EnginePool()
    async with engine() as (e, url):
        e.mode = "stall"
        stream = await open_engine_stream(pool, url, b"{}", {}, 2.0)
        await stream.first
        stream.attach(lambda data: None)
        freed = weakref.ref(stream)
        gc.disable()
        try:
            stream.finish(False)
            del stream
            assert freed() is None
        finally:
            gc.enable()
    pool.close()


async def test_refused_connection_is_an_upstream_connect_error() -> None:
    pool = EnginePool()
    async with engine() as (_, url):
        pass  # the server is gone: its port refuses
    with pytest.raises(UpstreamError) as exc:
        await open_engine_stream(pool, url, b"{}", {}, 1.0)
    assert exc.value.kind == "connect"


async def test_https_engines_are_verified_and_kept_alive(certs: CertFiles) -> None:
    """vLLM started with --ssl-keyfile: the push relay speaks TLS to it, verified."""
    trusting = EnginePool(tls=ssl.create_default_context(cafile=str(certs.ca_cert)))
    async with engine(server_context(certs.cert, certs.key)) as (e, url):
        assert url.startswith("https://")
        assert await _fetch(trusting, url) == BODY
        assert await _fetch(trusting, url) == BODY
        assert (e.connections, e.requests) == (1, 2)
        with pytest.raises(UpstreamError) as exc:  # the system store does not know the test CA
            await open_engine_stream(EnginePool(), url, b"{}", {}, 2.0)
        assert exc.value.kind == "connect" and "CERTIFICATE" in str(exc.value).upper()
    trusting.close()
