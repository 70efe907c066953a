"""Connections per source address and per source network, capped at the accept, before any TLS.

`max_connections` bounds a listener's open connections; without a bound per source, one address
could hold them all (4,200 idle TCP connections from one address once left every other client a
503 for as long as it kept reconnecting), and without one per network, nine addresses of one
/24 did the same (an IPv6 host has a whole /64). A `CappedListener` closes a new connection at
once when its address already holds `max_connections_per_source`, or its network (IPv4 /24,
IPv6 /64: proxy/throttle.py's `network_of`) `max_connections_per_network`. Closed before TLS,
such a connection gets no HTTP answer. `CappedServer` is the listener's accept loop, which hands
each admitted connection to the event loop (`connect_accepted_socket`, TLS handshake and its
deadline included; on a TLS listener after proxy/plainhttp.py's look at its first bytes) and
gives its place back when it ends: the handshake
failed, or the connection's protocol lost it (`on_closed`). The accept loop is ours rather than
the event loop's server because uvloop accepts in C, where no per-source check can be added.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from proxy import plainhttp
from proxy.throttle import network_of

log = logging.getLogger("specrouter.servers")

_ACCEPTS_PER_WAKE = 128  # as asyncio's server: others wait for the next readiness
_EMFILE_PAUSE_S = 1.0  # out of descriptors: accepting again after this


class SourceCap:
    """Open connections per source address and per source network; one entry per address or
    network with connections open."""

    def __init__(self, limit: int, network_limit: int | None = None) -> None:
        self.limit = limit
        self.network_limit = limit if network_limit is None else network_limit
        self.open: dict[str, int] = {}
        self.refused = 0
        self._logged_at: dict[str, float] = {}

    def admit(self, source: str) -> bool:
        n = self.open.get(source, 0)
        net = network_of(source)
        held = 0 if net is None else self.open.get(net, 0)
        if n >= self.limit or held >= self.network_limit:
            self.refused += 1
            by_source = n >= self.limit
            kind, who, count = ("source", source, n) if by_source else ("network", net, held)
            now = time.monotonic()
            if now - self._logged_at.get(kind, -math.inf) >= 10.0:  # once every 10 s a kind
                self._logged_at[kind] = now
                log.warning(
                    "connection limit per %s reached: %s holds %d (max_connections_per_%s); "
                    "its new connections are closed",
                    kind,
                    who,
                    count,
                    kind,
                )
            return False
        self.open[source] = n + 1
        if net is not None:
            self.open[net] = held + 1
        return True

    def release(self, source: str) -> None:
        net = network_of(source)
        for key in (source,) if net is None else (source, net):
            n = self.open.get(key, 0) - 1
            if n > 0:
                self.open[key] = n
            else:
                self.open.pop(key, None)


class CappedListener(socket.socket):
    """A listening socket with its `SourceCap` (made by proxy/servers.py's `bind`)."""

    def __init__(self, cap: SourceCap, *args: Any) -> None:
        super().__init__(*args)
        self.cap = cap

    def accept_admitted(self) -> tuple[socket.socket, str] | None:
        """The next pending connection whose source is under its cap (the others are closed
        at once: no TLS, no protocol, no descriptor kept), or None when none is pending."""
        while True:
            try:
                conn, addr = self.accept()
            except (BlockingIOError, InterruptedError):
                return None
            source = str(addr[0]) if isinstance(addr, tuple) else ""
            if self.cap.admit(source):
                conn.setblocking(False)
                return conn, source
            conn.close()


class CappedServer:
    """The accept loop of one `CappedListener`; `close` and `wait_closed` as asyncio's Server
    (what uvicorn's shutdown calls)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: CappedListener,
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl_context: ssl.SSLContext | None,
        handshake_timeout_s: float | None,
    ) -> None:
        self._loop, self._sock, self._factory = loop, sock, protocol_factory
        self._ssl, self._handshake = ssl_context, handshake_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._serving = True
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_WAKE):
            try:
                admitted = self._sock.accept_admitted()
            except OSError as exc:  # EMFILE and the like: pause, as asyncio's server does
                log.warning("accept failed (%s): paused %gs", exc, _EMFILE_PAUSE_S)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(_EMFILE_PAUSE_S, self._resume)
                return
            if admitted is None:
                return
            task = self._loop.create_task(self._connect(*admitted))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _resume(self) -> None:
        if self._serving:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def _connect(self, conn: socket.socket, source: str) -> None:
        cap = self._sock.cap
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                cap.release(source)

        made = self._factory()  # the listener's count starts at the accept (proxy/servers.py)
        made.on_closed = release  # type: ignore[attr-defined]
        try:
            handshake = self._handshake
            if self._ssl is not None:  # plain HTTP gets a 400 that says https, not TLS's silence
                start = self._loop.time()
                if await plainhttp.refused(self._loop, conn, handshake or 60.0):
                    release()
                    return
                if handshake is not None:  # one deadline for the first byte and the handshake
                    handshake = max(0.1, handshake - (self._loop.time() - start))
            await self._loop.connect_accepted_socket(
                lambda: made, conn, ssl=self._ssl, ssl_handshake_timeout=handshake
            )
        except Exception:  # noqa: BLE001 - a failed or late handshake: the client's to retry
            release()
            with contextlib.suppress(OSError):
                conn.close()

    def close(self) -> None:
        if self._serving:
            self._serving = False
            with contextlib.suppress(ValueError, OSError):  # already closed by uvicorn
                self._loop.remove_reader(self._sock.fileno())

    async def wait_closed(self) -> None:
        return None
