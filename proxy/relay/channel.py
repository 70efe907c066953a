"""`PushChannel`: write access to one client connection, an ASGI extension that our server
protocol (proxy/servers.py) puts in the scope (`scope["extensions"]["specrouter.push"]`) for the
push relay (proxy/relay/push.py) to write chunked body bytes straight to the client's transport.

The framing has one owner, the gateway, through uvicorn's cycle state (pinned by
tests/test_uvicorn_contract.py): the head goes through ASGI, body chunks through the channel or
ASGI, the last chunk through ASGI; a response the gateway leaves unfinished on purpose (a
truncated engine body, a client gone or stalled) is ended by `end_unfinished`, never by uvicorn
guessing at an application error. docs/stream-core.md says why. A stream's head can be held
for its first event, and its end event for the chunked end (`hold_head`, `hold_last`): one
write each instead of two (docs/overhead.md).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any


class PushChannel:
    """Write access to one client connection, for the response in progress."""

    __slots__ = ("_protocol", "_transport", "_flow", "_held")

    def __init__(self, protocol: Any) -> None:
        # uvicorn's HttpToolsProtocol (our subclass), weakly: the channel sits in the scope the
        # protocol holds, and a strong reference back would make each connection, TLS buffers
        # and the request's objects included, a cycle that lives until a full collection.
        self._protocol: Any = weakref.proxy(protocol)
        self._transport = protocol.transport  # both fixed for the connection's life
        self._flow = protocol.flow
        self._held: bytes | None = None  # held bytes (b"": a head held, not written yet)

    @property
    def gone(self) -> bool:
        try:
            cycle = self._protocol.cycle
        except ReferenceError:  # the connection is over and its protocol freed
            return True
        return cycle is None or cycle.disconnected or self._transport.is_closing()

    async def drain(self) -> None:
        await self._flow.drain()

    def abort(self) -> None:
        """Close the client's connection at once, unsent bytes dropped (a client that stopped
        reading): the connection's loss then ends the request as the client's leaving does."""
        self._transport.abort()

    def end_unfinished(self) -> None:
        """The request is over with its response started and not complete: the connection is
        closed (what was written still goes out, so the client sees a body cut short) and the
        cycle marked over as a client's leaving marks it, so uvicorn takes the app's return as
        the response's end rather than logging "returned without completing response"."""
        try:
            cycle = self._protocol.cycle
        except ReferenceError:  # the connection is over and its protocol freed
            return
        if cycle is None or cycle.response_complete or not cycle.response_started:
            return
        self.flush_head()
        cycle.disconnected = True
        self._transport.close()

    def on_lost(self, callback: Callable[[], None] | None) -> None:
        """Called once when the client's connection closes (None: no longer)."""
        with contextlib.suppress(ReferenceError):  # freed: closed, nothing left to call back
            self._protocol.on_lost = callback

    def write(self, data: bytes) -> bool:
        """One chunk of the chunked body (the response start went out through ASGI); True
        when the client's socket is full and the engine should wait.

        The hot path, once per relayed chunk: a closing transport is the one sign of a client
        gone that matters here (uvicorn marks the cycle disconnected as it closes).
        """
        transport = self._transport
        if not transport.is_closing():
            if self._held is None:
                transport.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                transport.write(self._take_head() + b"%x\r\n%b\r\n" % (len(data), data))
        return bool(self._flow.write_paused)

    def hold_head(self) -> None:
        """The response head that uvicorn writes next is held, to go out with the first body
        bytes in one write (one TLS record, one send: ~60 us less CPU and latency to the first
        event). The holder owns the bound: it calls `flush_head` before it waits on anything,
        so a head never waits for an engine. Whatever uvicorn itself writes or closes meanwhile
        sends the head first (`_HeldHead`)."""
        with contextlib.suppress(ReferenceError):
            cycle = self._protocol.cycle
            if cycle is not None and self._held is None:
                self._held = b""
                cycle.transport = _HeldHead(self)

    def hold_last(self, data: bytes) -> None:
        """The stream's end event, held (after a held head, if any) to go out with the
        chunked body's end, which uvicorn writes, in one write. The holder flushes it unless
        the engine's stream is already complete (its end then follows without a wait)."""
        chunk = b"%x\r\n%b\r\n" % (len(data), data)
        if self._held is not None:
            self._held += chunk
            return
        with contextlib.suppress(ReferenceError):
            cycle = self._protocol.cycle
            if cycle is not None:
                self._held = chunk
                cycle.transport = _HeldHead(self)
                return
        self.write(data)

    def flush_head(self) -> None:
        """What is held goes out now (no body bytes came to carry it)."""
        if self._held is not None:
            head = self._take_head()
            if head and not self._transport.is_closing():
                self._transport.write(head)

    def _take_head(self) -> bytes:
        head, self._held = self._held or b"", None
        with contextlib.suppress(ReferenceError):
            cycle = self._protocol.cycle
            if cycle is not None and type(cycle.transport) is _HeldHead:
                cycle.transport = self._transport
        return head


class _HeldHead:
    """The client's transport as uvicorn's cycle sees it while bytes are held: its first write
    is kept when it is the head awaited; any other write, or a close, sends the held bytes
    first (the chunked end after a held end event: one write)."""

    __slots__ = ("_channel",)

    def __init__(self, channel: PushChannel) -> None:
        self._channel = channel

    def write(self, data: bytes) -> None:
        channel = self._channel
        if channel._held == b"":
            channel._held = bytes(data)
            return
        head = channel._take_head()
        if not channel._transport.is_closing():
            channel._transport.write(head + data)

    def close(self) -> None:
        self._channel.flush_head()
        self._channel._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel._transport, name)
