"""ASGI plumbing shared along the request path: the callables' types, one-shot JSON answers,
and the lifespan handshake."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.relay.errors import error_body

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    await send(
        {"type": "http.response.start", "status": status, "headers": [*_JSON, *(headers or [])]}
    )
    await send({"type": "http.response.body", "body": body})


async def respond_error(
    send: Send,
    status: int,
    message: str,
    *,
    param: str | None = None,
    type_: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await respond(send, status, error_body(status, message, param=param, type_=type_), headers)


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
