"""A draining listener's TLS connections dropped once what they were sent has left.

uvicorn's drain closes an idle connection at once, and one in flight once its response is
complete, then waits until every connection is gone. Over TLS a close sends `close_notify` and
then waits for the client's (asyncio's and uvloop's `ssl_shutdown_timeout`, 30 s). A client
that keeps its connection in a pool (every agent's SDK: httpx, aiohttp, undici) reads nothing
more from it, so none comes: one idle connection held a TERM's exit for the whole drain
deadline (the gateway killed after 10 s by its supervisor, with a connection per agent).

HTTP needs nothing from that wait (nginx does not wait either): once our bytes, `close_notify`
included, are in the client's hands, the socket is closed. "In its hands": the transport holds
none (`get_write_buffer_size`) and the kernel's send queue is empty (TIOCOUTQ: sent and
acknowledged). Checked every `POLL_S` while the connection lives, so a slow reader of a long
answer still gets all of it, within the drain's own deadline. Only while draining: elsewhere
the wait costs nothing but a socket, and a short `ssl_shutdown_timeout` for every connection
would cut a slow client's last bytes (the timeout covers flushing them too).
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import termios

POLL_S = 0.05


def unsent_bytes(transport: asyncio.BaseTransport) -> int | None:
    """Bytes the kernel has not yet had acknowledged (TIOCOUTQ); None without a socket."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return None
    out = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, out, True)
    except (OSError, ValueError):  # closed meanwhile
        return None
    return out[0]


class DrainClose:
    """One connection's drop, polled: `check` after uvicorn closed it during a drain."""

    __slots__ = ("_loop", "_transport", "_timer", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport) -> None:
        self._loop, self._transport = loop, transport
        self._timer: asyncio.TimerHandle | None = None
        self.done = False

    def check(self) -> None:
        """Drop the connection now when flushed, else look again in `POLL_S`; nothing while it
        is open (its response in flight: called again when it completes)."""
        self._timer = None
        transport = self._transport
        if self.done or not transport.is_closing():
            return
        if transport.get_write_buffer_size() == 0 and unsent_bytes(transport) == 0:
            self.done = True
            transport.abort()
            return
        self._timer = self._loop.call_later(POLL_S, self.check)

    def cancel(self) -> None:
        """The connection is gone (connection_lost)."""
        self.done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
