"""A raw, cheap HTTP/1.1 client on asyncio streams and httptools, for hostile or timed requests.

`Address.request` builds the exact bytes of a request (nothing added, nothing checked), so a
caller can send malformed ones as well; `Conn.exchange` sends them on a kept-alive connection and
returns what came back, complete or not, with the time of the first body bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httptools


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, base: str, ca_cert: Path | None) -> Address:
        u = urlsplit(base)
        tls = None
        if u.scheme == "https":
            tls = (
                ssl.create_default_context(cafile=str(ca_cert))
                if ca_cert
                else ssl._create_unverified_context()
            )
        return cls(u.hostname or "127.0.0.1", int(u.port or 443), tls)

    def request(
        self,
        path: str,
        body: bytes,
        key: str | None,
        *,
        method: str = "POST",
        headers: Sequence[tuple[str, str]] = (),
    ) -> bytes:
        lines = [
            f"{method} {path} HTTP/1.1",
            f"host: {self.host}:{self.port}",
            "content-type: application/json",
            f"content-length: {len(body)}",
        ]
        if key is not None:
            lines.append(f"authorization: Bearer {key}")
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class Reply:
    """httptools callbacks: one response."""

    __slots__ = ("status", "headers", "body", "complete", "head", "t_first")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.complete = False
        self.head = False
        self.t_first: float | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head = True

    def on_body(self, body: bytes) -> None:
        if self.t_first is None:
            self.t_first = time.monotonic()
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class Conn:
    """One keep-alive connection to the gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = 0
        self.keep = True

    @classmethod
    async def open(cls, target: Address) -> Conn:
        reader, writer = await asyncio.open_connection(
            target.host,
            target.port,
            ssl=target.tls,
            server_hostname=target.host if target.tls is not None else None,
        )
        return cls(reader, writer)

    async def exchange(self, request: bytes, *, until_body: bool = False) -> Reply:
        """Send one request and read its response (or, with `until_body`, its first body
        bytes). Returns what arrived, complete or not, when the connection ends."""
        reply = Reply()
        parser = httptools.HttpResponseParser(reply)
        self.used += 1
        self.writer.write(request)
        while not reply.complete:
            data = await self.reader.read(65536)
            if not data:
                self.keep = False
                break
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade:  # pragma: no cover - never asked for
                break
            except httptools.HttpParserError:
                self.keep = False
                break
            if reply.head and not reply.status:
                reply.status = parser.get_status_code()
            if until_body and reply.body:
                break
        if reply.head and not reply.status:
            reply.status = parser.get_status_code()
        if reply.headers.get("connection", "").lower() == "close":
            self.keep = False
        return reply

    def abort(self) -> None:
        """Drop the connection at once, as a client that goes away does."""
        self.keep = False
        transport = self.writer.transport
        transport.abort()

    async def close(self) -> None:
        self.keep = False
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1):
                await self.writer.wait_closed()
