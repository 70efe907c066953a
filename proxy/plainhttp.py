"""Plain HTTP sent to the TLS listener: a short 400 that says to use https, before any TLS.

A TLS client's first byte is a handshake record (0x16); an HTTP request's is a method's letter.
The accept loop (proxy/accept.py) peeks at the first bytes of each admitted connection before
handing it to TLS: a letter gets a 400 in the API's shape (Anthropic's on /v1/messages) written
on the raw socket, then the connection is closed; without the peek, OpenSSL drops it and the
client sees an empty reply. Bounded: the wait for a first byte is the handshake's own deadline,
one peek of at most `_PEEK` bytes, one write of the answer, and at most `_DRAIN_S` seconds and
`_DRAIN_BYTES` bytes read while the client takes it (closing with unread data would reset the
connection under the answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from proxy.relay.errors import error_body

_PEEK = 512
_DRAIN_S = 1.0
_DRAIN_BYTES = 64 * 1024
MESSAGE = "this port speaks TLS: use https:// (a plain HTTP request was sent to the HTTPS port)"


def answer(head: bytes) -> bytes:
    """The 400 for a request whose first bytes are `head`."""
    parts = head.split(b" ", 2)
    path = parts[1] if len(parts) > 2 else b"/"
    body = error_body(400, MESSAGE, anthropic=path.startswith(b"/v1/messages"))
    return (
        b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
    )


async def _readable(loop: asyncio.AbstractEventLoop, conn: socket.socket, timeout: float) -> bool:
    ready: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await asyncio.wait_for(ready, timeout)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


async def refused(loop: asyncio.AbstractEventLoop, conn: socket.socket, timeout: float) -> bool:
    """Whether the connection was dealt with here (plain HTTP answered, or nothing sent within
    `timeout`, or gone): then it is closed. False: its first byte is not a letter, TLS goes on."""
    try:
        if not await _readable(loop, conn, timeout):
            conn.close()
            return True
        head = conn.recv(_PEEK, socket.MSG_PEEK)
    except OSError:
        conn.close()
        return True
    if head[:1].isalpha():
        await _answer(loop, conn, head)
        return True
    if not head:  # closed before a byte
        conn.close()
        return True
    return False


async def _answer(loop: asyncio.AbstractEventLoop, conn: socket.socket, head: bytes) -> None:
    try:
        conn.send(answer(head))  # a few hundred bytes into an empty send buffer
        conn.shutdown(socket.SHUT_WR)
        drained, deadline = 0, loop.time() + _DRAIN_S
        while drained < _DRAIN_BYTES:
            left = deadline - loop.time()
            if left <= 0 or not await _readable(loop, conn, left):
                break
            data = conn.recv(16 * 1024)
            if not data:
                break
            drained += len(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            conn.close()
