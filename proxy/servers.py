"""Run ASGI apps on uvicorn over pre-bound sockets, several in one event loop.

Pre-binding lets `--listen 127.0.0.1:0` pick a free port and print it; sharing one loop lets
the public and admin listeners share the gateway's state. Signals are handled by the caller,
not by each uvicorn server (two servers would otherwise fight over the handlers).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.relay.errors import error_body
from proxy.relay.push import PushChannel

# Slow-header clients (slowloris) hold a connection open forever in plain uvicorn: a request's
# headers must arrive within this long of its first byte (or of the connection).
HEADER_TIMEOUT_S = 10.0
# Header block limit: beyond it the connection gets 431 and is closed.
MAX_HEADER_BYTES = 64 * 1024


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for the request head and a size limit."""

    header_timeout_s = HEADER_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    # The request in progress learns of the client leaving here, without a task of its own
    # waiting on `receive()` (proxy/relay/watch.py's DisconnectWatch, through the PushChannel).
    on_lost: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_bytes = 0
            self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_too_slow)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        self._refuse(408, "Request Timeout",
                     f"request headers not received within {self.header_timeout_s:g}s")

    def _refuse(self, status: int, phrase: str, message: str) -> None:
        """Answer below ASGI (no request was formed) in the OpenAI error shape, then close."""
        if self.transport.is_closing():
            return
        body = error_body(status, message)
        self.transport.write(b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\nconnection: close\r\n\r\n%b"
                             % (status, phrase.encode(), len(body), body))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > MAX_HEADER_BYTES:
                self._disarm()
                self._refuse(431, "Request Header Fields Too Large",
                             f"request headers larger than {MAX_HEADER_BYTES} bytes")
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        # The push relay's channel to this connection (proxy/relay/push.py), as an ASGI extension.
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
        extensions["specrouter.push"] = PushChannel(self)
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback()


class QuietSignalsServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(app: Any, *, ssl_context: ssl.SSLContext | None = None,
                graceful_s: int | None = None, header_timeout_s: float = HEADER_TIMEOUT_S,
                **config: Any) -> QuietSignalsServer:
    protocol = type("HttpProtocol", (GuardedHttpToolsProtocol,),
                    {"header_timeout_s": header_timeout_s})
    cfg = uvicorn.Config(app, http=protocol, loop="none", lifespan="off", proxy_headers=False,
                         access_log=False, log_level="warning", server_header=False,
                         date_header=False, timeout_graceful_shutdown=graceful_s,
                         timeout_keep_alive=75, **config)
    cfg.load()
    if ssl_context is not None:
        # Our own context, so SIGHUP can load a renewed certificate into it in place.
        cfg.ssl = ssl_context
    return QuietSignalsServer(cfg)


def url_of(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
