"""Keepalive during a silent prefill (a route's `keepalive_s`): the response headers, then a
ping every `keepalive_s`, while no engine byte has come.

Agents' stream watchdogs and load balancers cut a stream that sends nothing for a while, and a
long prefill sends nothing for seconds. The pings are the only bytes a client can get that the
engine did not send for its request; they stop before the engine's first byte is relayed, so
they never fall inside an engine event, and the measurement never sees them. After the
engine's first byte and until its first output the stream core (proxy/relay/stream_core.py)
pings on, with `RELAY_PINGS`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.relay.asgi import Send

Headers = list[tuple[bytes, bytes]]

COMMENT_PING = b": ping\n\n"  # an SSE comment: every SSE client skips it
MESSAGES_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # Anthropic's own ping event
# A data event of a type no client acts on (Codex's parser drops unknown types; the OpenAI SDKs
# pass it on); no `sequence_number`, so the engine's own numbering is left whole.
RESPONSES_PING = b'event: keepalive\ndata: {"type":"keepalive"}\n\n'
# Before the engine's first byte, by API kind; chat, completions and Responses get the comment
# (the OpenAI SDKs' Responses stream helpers refuse any event before `response.created`).
PINGS: dict[str, bytes] = {"messages": MESSAGES_PING}
# After it and until its first output (the stream core's pings): on Responses, the data event,
# which Codex's idle timer counts (it does not count comments).
RELAY_PINGS: dict[str, bytes] = {"messages": MESSAGES_PING, "responses": RESPONSES_PING}
# What the engine's event-stream answer carries; vLLM's content type, as Starlette writes it.
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class Pinger:
    """Runs beside the attempts (proxy/relay/forward.py) until `stop`; `headers` gives the
    response headers when they are due (they name the backend being tried then)."""

    __slots__ = ("_send", "_every", "_frame", "_headers", "_stop", "_task", "started")

    def __init__(
        self, send: Send, every: float, t0: float, frame: bytes, headers: Callable[[], Headers]
    ) -> None:
        self._send, self._every, self._frame, self._headers = send, every, frame, headers
        self._stop = asyncio.Event()
        self.started = False  # the response start has gone to the client
        # The first ping is due `every` after the request arrived (t0, perf_counter).
        first = max(0.0, every - (time.perf_counter() - t0))
        self._task = asyncio.get_running_loop().create_task(self._run(first))

    async def _run(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        while True:
            try:
                async with asyncio.timeout_at(due):
                    await self._stop.wait()
                return
            except TimeoutError:
                pass
            if not self.started:
                self.started = True
                await self._send(
                    {"type": "http.response.start", "status": 200, "headers": self._headers()}
                )
            await self._send({"type": "http.response.body", "body": self._frame, "more_body": True})
            due = max(due + self._every, loop.time())

    @property
    def every(self) -> float:
        return self._every

    async def stop(self) -> bool:
        """No more pings (a ping being written is finished first); whether headers went out."""
        self._stop.set()
        await self._task
        return self.started

    def cancel(self) -> None:
        """The request is over, however it ended."""
        if not self._task.done():
            self._task.cancel()
        elif not self._task.cancelled():
            self._task.exception()  # retrieved: a failed send is the relay's to notice
