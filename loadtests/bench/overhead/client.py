"""The load client: raw asyncio protocol + httptools, counting SSE events as they arrive."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import cast

import httptools
import orjson

from loadtests.bench.overhead.stack import MODEL, Arm


@dataclass(slots=True)
class Shot:
    """One request as the client saw it; times are perf_counter seconds."""

    t_sent: float
    t_first: float | None = None  # first complete SSE event
    frames: int = 0  # complete SSE events, [DONE] included
    times: list[float] | None = None  # arrival time of each event, when recorded
    status: int = 0
    ok: bool = False


class Tally:
    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0


class ClientConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; counts SSE events as their `\\n\\n` arrives."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.shot: Shot | None = None
        self.fut: asyncio.Future[Shot] | None = None
        self.alive = False
        self.keep = True
        self.now = 0.0
        self._nl = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.alive = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("connection lost mid-response"))

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.fut is not None and not self.fut.done():
                self.fut.set_exception(ConnectionError(f"bad response: {exc}"))
            self.abort()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"connection" and value.lower() == b"close":
            self.keep = False

    def on_headers_complete(self) -> None:
        if self.shot is not None:
            self.shot.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        n = body.count(b"\n\n")
        if self._nl and body[:1] == b"\n":
            n += 1
        self._nl = body[-1:] == b"\n" and body[-2:] != b"\n\n"
        shot = self.shot
        if n and shot is not None:
            if shot.frames == 0:
                shot.t_first = self.now
            shot.frames += n
            self.tally.frames += n
            if shot.times is not None:
                shot.times.extend([self.now] * n)

    def on_message_complete(self) -> None:
        shot, fut = self.shot, self.fut
        if shot is not None and fut is not None and not fut.done():
            shot.ok = shot.status == 200
            fut.set_result(shot)
        if not self.keep and self.transport is not None:
            self.transport.close()

    def request(self, payload: bytes, *, record_times: bool) -> asyncio.Future[Shot]:
        assert self.transport is not None
        self.fut = asyncio.get_running_loop().create_future()
        self._nl = False
        self.shot = Shot(time.perf_counter(), times=[] if record_times else None)
        self.transport.write(payload)
        return self.fut

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.alive = False


class Pool:
    """The client's connections to one target, opened (and TLS-handshaken) before a round."""

    def __init__(self, target: Arm, tally: Tally) -> None:
        self.target = target
        self.tally = tally
        self.conns: list[ClientConn] = []

    async def _open(self) -> ClientConn:
        loop = asyncio.get_running_loop()
        t = self.target
        _, proto = await loop.create_connection(
            lambda: ClientConn(self.tally),
            "127.0.0.1",
            t.port,
            ssl=t.tls,
            server_hostname="127.0.0.1" if t.tls is not None else None,
        )
        return proto

    async def ensure(self, n: int) -> list[ClientConn]:
        self.conns = [c for c in self.conns if c.alive and c.keep]
        async with asyncio.timeout(60):
            while len(self.conns) < n:
                batch = min(32, n - len(self.conns))
                self.conns += await asyncio.gather(*(self._open() for _ in range(batch)))
        return self.conns[:n]

    def abort(self) -> None:
        for conn in self.conns:
            conn.abort()
        self.conns = []


def request_bytes(
    target: Arm, *, max_tokens: int, step_ms: float, prompt_bytes: int, tokens_per_chunk: int = 1
) -> bytes:
    system = "You are a coding agent. " * max(1, prompt_bytes // 24)
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": system[:prompt_bytes]},
                {"role": "user", "content": "Refactor the relay loop."},
            ],
            "stream": True,
            "max_tokens": max_tokens,
            "vllm_xargs": {"pacer_step_ms": step_ms, "pacer_tokens_per_chunk": tokens_per_chunk},
        }
    )
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
        b"content-type: application/json\r\naccept: text/event-stream\r\n"
        % target.port
        + target.auth
        + b"content-length: %d\r\n\r\n" % len(body)
    )
    return head + body


def iter_frames(body: bytes) -> Iterator[bytes]:
    """SSE events of a body, each with its `\\n\\n` (for tests and checks)."""
    for part in body.split(b"\n\n"):
        if part:
            yield part + b"\n\n"
