"""ASGI plumbing shared along the request path: the callables' types, one-shot JSON answers,
and the lifespan handshake."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from proxy.relay.errors import error_body

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = [(b"content-type", b"application/json")]
# The OpenAI and Anthropic SDKs' own header for "retry this" (they obey it before their status
# rules): sent with every answer that says when to retry (docs/clients.md).
SHOULD_RETRY = (b"x-should-retry", b"true")


def with_should_retry(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """`headers`, with `x-should-retry: true` when they carry a `retry-after`."""
    if any(k == b"retry-after" for k, _ in headers) and all(
        k != SHOULD_RETRY[0] for k, _ in headers
    ):
        return [*headers, SHOULD_RETRY]
    return headers


async def respond(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    out = with_should_retry([*_JSON, *(headers or [])])
    await send({"type": "http.response.start", "status": status, "headers": out})
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
