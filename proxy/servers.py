"""Run ASGI apps on uvicorn over pre-bound sockets, several in one event loop.

Pre-binding lets `--listen 127.0.0.1:0` pick a free port and print it; sharing one loop lets
the public and admin listeners share the gateway's state. Signals are handled by the caller,
not by each uvicorn server (two servers would otherwise fight over the handlers).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import resource
import socket
import ssl
import weakref
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.accept import CappedListener, CappedServer, SourceCap
from proxy.drain_close import DrainClose
from proxy.relay.channel import PushChannel
from proxy.relay.errors import error_body

log = logging.getLogger("specrouter.servers")

# Slow-header clients (slowloris) hold a connection open forever in plain uvicorn: a request's
# headers must arrive within this long of its first byte (or of the connection).
HEADER_TIMEOUT_S = 10.0
# Header block limit: beyond it the connection gets 431 and is closed.
MAX_HEADER_BYTES = 64 * 1024
# asyncio holds a connection that never starts TLS for 60 s; these are the settings' defaults.
HANDSHAKE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 4096
KEEP_ALIVE_S = 75.0
# A WebSocket upgrade (Codex's built-in provider tries one first) gets 426, on which Codex falls
# back to HTTP at once; any other status costs it a reconnect delay (docs/clients.md).
WEBSOCKET_REFUSAL = (
    "WebSocket is not served: responses stream over HTTP (server-sent events); "
    "`specrouter connect codex` writes a Codex provider that uses them"
)
# Headers that name who is asking or which answer: two copies would be read differently by
# different readers (first-wins here, last-wins there), so two are refused.
_SINGLE_HEADERS = frozenset(
    {
        b"authorization",
        b"x-api-key",
        b"x-request-id",
        b"x-specrouter-variant",
        b"transfer-encoding",
        b"content-length",
    }
)


# The listener's 503 when full: a place comes back as soon as any connection closes.
_RETRY_FULL = b"retry-after: 1\r\nx-should-retry: true\r\n"


class ConnectionCap:
    """Open connections of one listener, counted from the accept (before any TLS handshake)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.open, self.logged = limit, 0, False

    def enter(self) -> None:
        self.open += 1

    def leave(self) -> None:
        self.open -= 1
        if self.open < self.limit:
            self.logged = False

    def full(self) -> bool:
        if self.open <= self.limit:
            return False
        if not self.logged:  # once each time the limit is reached
            self.logged = True
            log.warning(
                "connection limit reached: %d open (max_connections %d); refusing new connections",
                self.open,
                self.limit,
            )
        return True


class _Refused(Exception):
    """Raised from a parser callback: the request is answered below ASGI (`_refusal`)."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for the request head, a size limit, a
    connection cap, and no ambiguous requests: trailers never become headers, and a duplicate
    identity header, an `Upgrade` (426 for a WebSocket), a transfer coding other than `chunked` or an encoded slash
    in the path is refused before the app sees the request."""

    header_timeout_s = HEADER_TIMEOUT_S
    handshake_timeout_s = HANDSHAKE_TIMEOUT_S
    keep_alive_unauthenticated_s: float | None = None  # None: uvicorn's keep-alive
    cap = ConnectionCap(MAX_CONNECTIONS)
    _head_timer: asyncio.TimerHandle | None = None
    _head_bytes = 0
    _head_size = 0  # the current request's head as parsed (line and headers)
    _sniffed = b""  # the first request's path, read off its first bytes
    _in_head = False  # between a message's start and its headers' end: headers are headers
    _refusal: tuple[int, str, str] | None = None
    # The request in progress learns of the client leaving here, without a task of its own
    # waiting on `receive()` (proxy/relay/watch.py's DisconnectWatch, through the PushChannel).
    on_lost: Callable[[], None] | None = None
    # The listener's per-source count (proxy/accept.py), given back when the connection ends.
    on_closed: Callable[[], None] | None = None
    # A drain's close of a TLS connection, dropped once flushed (proxy/drain_close.py).
    _drain: DrainClose | None = None

    def __init__(
        self,
        config: uvicorn.Config,
        server_state: Any,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._keep_alive_s = self.timeout_keep_alive
        if self.keep_alive_unauthenticated_s is not None:
            self.timeout_keep_alive = self.keep_alive_unauthenticated_s  # type: ignore[assignment]
        # Made at the accept: a TLS handshake that never completes never calls connection_made
        # nor connection_lost, so the count forgets it once the handshake deadline is past.
        self.cap.enter()
        self._counted = True
        self._uncount = self.loop.call_later(self.handshake_timeout_s + 0.5, self._leave)

    def _leave(self) -> None:
        if self._counted:
            self._counted = False
            self.cap.leave()

    def authenticated(self) -> None:
        """The app says a request on this connection carried valid credentials: it may idle
        as long as any other."""
        self.timeout_keep_alive = self._keep_alive_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._uncount.cancel()
        super().connection_made(transport)
        if self.cap.full():
            self._refuse(503, "Service Unavailable", "too many connections; retry", _RETRY_FULL)
            return
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
        self._refuse(
            408,
            "Request Timeout",
            f"request headers not received within {self.header_timeout_s:g}s",
        )

    def _refuse(self, status: int, phrase: str, message: str, headers: bytes = b"") -> None:
        """Answer below ASGI (no request was formed) in the API's error shape (Anthropic's on
        /v1/messages, OpenAI's elsewhere), then close."""
        if self.transport.is_closing():
            return
        path = getattr(self, "url", b"") or self._sniffed
        body = error_body(status, message, anthropic=path.startswith(b"/v1/messages"))
        self.transport.write(
            b"HTTP/1.1 %d %b\r\ncontent-type: application/json\r\n%b"
            b"content-length: %d\r\nconnection: close\r\n\r\n%b"
            % (status, phrase.encode(), headers, len(body), body)
        )
        self.transport.close()

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to a parser error; a callback of ours that refused says why instead.
        # uvicorn's own is plain text: a malformed head (a bad Transfer-Encoding, say) is
        # answered in the API's shape too.
        refusal, self._refusal = self._refusal, None
        self._refuse(*(refusal or (400, "Bad Request", "invalid HTTP request")))

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return  # refused: nothing more is parsed
        if not self._sniffed and data[:1].isalpha():  # the path, for a refusal's shape
            self._sniffed = data.split(b" ", 2)[1][:64] if data.count(b" ", 0, 80) >= 2 else b"/"
        if self._head_timer is not None:
            end = data.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else end
            if self._head_bytes > MAX_HEADER_BYTES:
                self._disarm()
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"request headers larger than {MAX_HEADER_BYTES} bytes",
                )
                return
        super().data_received(data)
        if self._in_head and self._head_timer is None and not self.transport.is_closing():
            # A head that did not end in the read it began in: timed from now (one that did,
            # most on a kept-alive connection, never arms a timer to cancel).
            self._arm()
            self._head_bytes = len(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_size = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count_head(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools reports a chunked body's trailers here too: uvicorn would add them to the
        # request's headers (Authorization included) after the app had read them.
        if self._in_head:
            self._count_head(len(name) + len(value) + 4)
            super().on_header(name, value)

    def _count_head(self, n: int) -> None:
        """The head limit, counted as the parser reads it: `data_received`'s count misses a
        pipelined request's head that arrives in the same read as the one before it."""
        self._head_size += n
        if self._head_size > MAX_HEADER_BYTES:
            self._refusal = (
                431,
                "Request Header Fields Too Large",
                f"request headers larger than {MAX_HEADER_BYTES} bytes",
            )
            raise _Refused(self._refusal[2])

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        problem = self._ambiguity()
        if problem is not None:
            self._refusal = problem
            raise _Refused(problem[2])
        # The push relay's channel to this connection (proxy/relay/push.py), as an ASGI extension.
        extensions: dict[str, Any] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
        extensions["specrouter.push"] = PushChannel(self)
        extensions["specrouter.authenticated"] = _weakly(self.authenticated)
        super().on_headers_complete()

    def _ambiguity(self) -> tuple[int, str, str] | None:
        """Why the request cannot be read one way only, or None."""
        seen: set[bytes] = set()
        for name, value in self.headers:
            if name in _SINGLE_HEADERS:
                if name in seen:
                    return 400, "Bad Request", f"more than one {name.decode()} header"
                seen.add(name)
            if name == b"transfer-encoding" and value.strip().lower() != b"chunked":
                return 400, "Bad Request", "the only transfer coding accepted is `chunked`"
            if name == b"upgrade" and value.strip().lower() == b"websocket":
                return 426, "Upgrade Required", WEBSOCKET_REFUSAL
            if name == b"upgrade":
                return 400, "Bad Request", "protocol upgrades are not supported"
        path = self.url.split(b"?", 1)[0].lower()
        if b"%2f" in path or b"%5c" in path:
            return 404, "Not Found", "no route for a path with an encoded slash"
        if b"%" in path and _needless_escape(path):
            # `/%76%31/chat/completions` was routed: a character that needs no escape has one
            # spelling (RFC 3986's unreserved), so an escaped one names no route.
            return 404, "Not Found", "no route for a percent-encoded path"
        return None

    def shutdown(self) -> None:
        """uvicorn's drain: closed now when idle, after its response otherwise; over TLS not
        held open for a `close_notify` a pooled client never sends."""
        super().shutdown()
        if self.transport.get_extra_info("sslcontext") is not None:
            self._drain = DrainClose(self.loop, self.transport)
            self._drain.check()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._drain is not None:  # closed by uvicorn just before this call
            self._drain.check()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._drain is not None:
            self._drain.cancel()
        self._disarm()
        self._leave()
        closed, self.on_closed = self.on_closed, None
        if closed is not None:
            closed()
        super().connection_lost(exc)
        callback, self.on_lost = self.on_lost, None
        if callback is not None:
            callback()


_UNRESERVED = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~")
_ESCAPE = re.compile(rb"%([0-9a-fA-F]{2})?")


def _needless_escape(path: bytes) -> bool:
    """A `%` that is not two hex digits, or escapes a character that needs none."""
    return any(
        m.group(1) is None or int(m.group(1), 16) in _UNRESERVED for m in _ESCAPE.finditer(path)
    )


def _weakly(method: Callable[[], None]) -> Callable[[], None]:
    """`method`, without holding its object: a protocol's bound method in its own scope is a
    cycle that keeps the connection (TLS buffers, the request's objects) until a full
    collection, hundreds of them under load (tests/bench/test_faults.py's RSS bound)."""
    ref = weakref.WeakMethod(method)

    def call() -> None:
        bound = ref()
        if bound is not None:  # None: the connection is over and its protocol freed
            bound()

    return call


class QuietSignalsServer(uvicorn.Server):
    handshake_timeout_s = HANDSHAKE_TIMEOUT_S

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup for pre-bound sockets, with a TLS handshake deadline (uvicorn
        passes none, so asyncio's 60 s applies). Lifespan is off: nothing else to start."""
        assert sockets is not None, "make_server's servers serve pre-bound sockets"
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state={}, _loop=_loop
            )

        handshake = self.handshake_timeout_s if config.ssl is not None else None
        self.servers = [
            CappedServer(loop, sock, create_protocol, config.ssl, handshake)  # type: ignore[misc]
            if isinstance(sock, CappedListener)
            else await loop.create_server(
                create_protocol,
                sock=sock,
                ssl=config.ssl,
                backlog=config.backlog,
                ssl_handshake_timeout=handshake,
            )
            for sock in sockets
        ]
        self.started = True


def bind(
    host: str, port: int, *, per_source: int | None = None, per_network: int | None = None
) -> socket.socket:
    """A listening socket; with `per_source`, one that closes a new connection at the accept
    when its source address already holds that many, or its network `per_network` (`SourceCap`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock: socket.socket = (
        socket.socket(family, socket.SOCK_STREAM)
        if per_source is None
        else CappedListener(SourceCap(per_source, per_network), family, socket.SOCK_STREAM)
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


NOFILE = 65536  # LimitNOFILE / ulimits in the shipped systemd and compose files


def raise_nofile(want: int = NOFILE) -> int:
    """Raise the soft descriptor limit to `want` (within the hard limit), for environments
    that set none (Kubernetes); returns the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    return soft


def make_server(
    app: Any,
    *,
    ssl_context: ssl.SSLContext | None = None,
    graceful_s: int | None = None,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    keep_alive_s: float = KEEP_ALIVE_S,
    keep_alive_unauthenticated_s: float | None = None,
    **config: Any,
) -> QuietSignalsServer:
    raise_nofile()
    protocol = type(
        "HttpProtocol",
        (GuardedHttpToolsProtocol,),
        {
            "header_timeout_s": header_timeout_s,
            "handshake_timeout_s": handshake_timeout_s,
            "keep_alive_unauthenticated_s": keep_alive_unauthenticated_s,
            "cap": ConnectionCap(max_connections),
        },
    )
    cfg = uvicorn.Config(
        app,
        http=protocol,
        loop="none",
        lifespan="off",
        proxy_headers=False,
        access_log=False,
        log_level="warning",
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=graceful_s,
        timeout_keep_alive=keep_alive_s,  # type: ignore[arg-type]
        **config,
    )
    cfg.load()
    if ssl_context is not None:
        # Our own context, so SIGHUP can load a renewed certificate into it in place.
        cfg.ssl = ssl_context
    server = QuietSignalsServer(cfg)
    server.handshake_timeout_s = handshake_timeout_s
    return server


def url_of(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
