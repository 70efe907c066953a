"""Keepalive during a silent prefill (a route's `keepalive_s`): the response headers, then a
ping every `keepalive_s`, while no engine byte has come.

Agents' stream watchdogs and load balancers cut a stream that sends nothing for a while, and a
long prefill sends nothing for seconds. The pings are the only bytes a client can get that the
engine did not send for its request; they stop before the engine's first byte is relayed, so
they never fall inside an engine event, and the measurement never sees them.

`SilenceLimit` is the other half of a long prefill: the relays' deadline for a quiet stream.
An engine may send events before its first output (vLLM's Responses stream sends
`response.created` and `response.in_progress` at once, then nothing until the prefill ends), so
until the first output (text, reasoning, a tool call) the first-byte timeout runs from the moment
the engine was asked; after it, the idle timeout from the last byte. docs/failures.md says why the
engine's early events are relayed rather than held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from proxy.relay.asgi import Send
from proxy.relay.measure import Measurement
from proxy.settings import Settings

Headers = list[tuple[bytes, bytes]]

COMMENT_PING = b": ping\n\n"  # an SSE comment: every SSE client skips it
MESSAGES_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # Anthropic's own ping event
# By API kind; chat, completions and Responses streams get the comment.
PINGS: dict[str, bytes] = {"messages": MESSAGES_PING}
# What the engine's event-stream answer carries; vLLM's content type, as Starlette writes it.
SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class SilenceLimit:
    """When a quiet stream is cut, in loop time; sans-io: the relay passes its clock readings.

    `asked_ago`: seconds since the engine was asked (the first-byte timeout counts from then).
    """

    __slots__ = ("idle", "first_byte", "first_due")

    def __init__(self, idle: float, first_byte: float, now: float, asked_ago: float) -> None:
        self.idle, self.first_byte = idle, first_byte
        self.first_due = now - max(0.0, asked_ago) + first_byte

    def due(self, last_activity: float, has_output: bool) -> float:
        """The deadline after a byte at `last_activity`; never sooner than the first-byte
        timeout while the engine has not output (never later than the idle timeout after)."""
        idle_due = last_activity + self.idle
        return idle_due if has_output else max(idle_due, self.first_due)

    def message(self, has_output: bool) -> str:
        if has_output:
            return f"upstream sent nothing for {self.idle:g}s"
        return f"upstream sent no output in {max(self.first_byte, self.idle):g}s"


def silence_limit(m: Measurement, settings: Settings, now: float) -> SilenceLimit:
    """A relayed stream's limit, the first-byte timeout counted from when its engine was asked."""
    asked = m.t_engine if m.t_engine is not None else m.t_start
    return SilenceLimit(
        settings.idle_timeout_s, settings.first_byte_timeout_s, now, time.perf_counter() - asked
    )


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
