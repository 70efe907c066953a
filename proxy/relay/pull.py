"""The streaming relay: upstream bytes to the client as they arrive, measured, never buffered.

A pull loop (read upstream, filter, `send`) so backpressure flows end to end: a slow client
pauses uvicorn's `send`, which stops the reads, which closes the TCP window toward vLLM.
The upstream response is closed on every exit path; the client's disconnect is noticed by a
watcher (`DisconnectWatch`), because uvicorn's `send` goes quiet rather than failing once it
is gone.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import aiohttp

from proxy.relay import sse
from proxy.relay.errors import sse_error_event
from proxy.relay.measure import Measurement, StreamFilter
from proxy.relay.upstream import UpstreamError
from proxy.vllm_wire import CRLF_DONE, DONE

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_BODY_COPY_LIMIT = 4 * 1024 * 1024  # non-streaming bodies kept for measurement up to this


class _Closable(Protocol):
    def close(self) -> None: ...


def _close(response: _Closable, reason: str) -> None:
    """Close an upstream response, waking a pending read with an exception of its own.

    aiohttp wakes a reader interrupted by close() with one module-level exception whose
    traceback grows with every raise, keeping each request's frames alive for good.
    """
    content = getattr(response, "content", None)
    if content is not None and hasattr(content, "set_exception"):
        content.set_exception(aiohttp.ClientConnectionError(reason))
    response.close()


class LostHook(Protocol):
    """Our server's connection (proxy/relay/push.py's PushChannel): it calls back when it closes."""

    @property
    def gone(self) -> bool: ...
    def on_lost(self, callback: Callable[[], None] | None) -> None: ...


class DisconnectWatch:
    """Notices the client leaving once the request body is read, and then cancels the pending
    upstream call or closes the upstream response, so vLLM aborts the generation at once
    instead of at the next chunk.

    On our own server the connection calls back when it closes (`hook`); on any other ASGI
    server a task listens on `receive()` for `http.disconnect`.
    """

    __slots__ = ("gone", "closing", "response", "pending", "_task", "_hook")

    def __init__(self, receive: Receive, hook: LostHook | None = None) -> None:
        self.gone = False
        self.closing: str | None = None  # set when the gateway itself ends the stream
        self.response: _Closable | None = None  # an aiohttp response or a push EngineStream
        self.pending: asyncio.Future[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._hook = hook
        if hook is None:
            self._task = asyncio.get_running_loop().create_task(self._watch(receive))
        elif hook.gone:
            self.gone = True  # it left while the body was being read
        else:
            hook.on_lost(self._lost)

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
        self._lost()

    def _lost(self) -> None:
        self.gone = True
        if self.pending is not None and not self.pending.done():
            self.pending.cancel()
        if self.response is not None:
            _close(self.response, "client gone")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._hook is not None:
            self._hook.on_lost(None)

    def close_upstream(self, reason: str) -> None:
        """End the relay from outside (shutdown deadline): the client gets an error event."""
        self.closing = reason
        if self.response is not None:
            _close(self.response, reason)


async def first_chunk(resp: aiohttp.ClientResponse, timeout: float) -> bytes:
    """The first body bytes: until they arrive, the request can still go to another backend."""
    try:
        async with asyncio.timeout(timeout):
            data = await resp.content.readany()
    except TimeoutError as exc:
        raise UpstreamError("timeout", f"no first byte in {timeout:g}s") from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamError("connect", f"{type(exc).__name__}: {exc}") from exc
    if not data and resp.status == 200 and resp.content_length != 0:
        raise UpstreamError("connect", "backend closed the response before the first byte")
    return data


# How a complete stream ends: vLLM's `[DONE]`, or on /v1/responses a terminal event.
CHAT_ENDS = (DONE,)
RESPONSES_ENDS = (b"event: response.completed", b"event: response.incomplete",
                  b"event: response.failed")


Resume = Callable[[], Awaitable["tuple[aiohttp.ClientResponse, bytes] | None"]]


async def relay_sse(resp: aiohttp.ClientResponse, first: bytes, send: Send, watch: DisconnectWatch,
                    filt: StreamFilter, idle_timeout: float,
                    ends: tuple[bytes, ...] = CHAT_ENDS, resume: Resume | None = None) -> str:
    """Relay an event stream; returns the outcome: ok, client_gone, upstream_error, timeout.

    The response start has been sent. After the first byte there is no retry: a failing
    backend ends the stream with vLLM's error event and `[DONE]`, so no client hangs, unless
    `resume` gives a continuation stream from another engine (see proxy/relay/continuation.py).
    """
    m = filt.m
    loop = asyncio.get_running_loop()
    responses = ends is RESPONSES_ENDS
    data = first
    while True:
        splitter = sse.FrameSplitter()  # a dead upstream's partial frame is never sent
        content = resp.content
        saw_done = False
        outcome = "ok"
        error = b""
        try:
            rearmed = loop.time()
            async with asyncio.timeout_at(rearmed + idle_timeout + 1.0) as deadline:
                while data:
                    now = time.perf_counter()
                    out = filter_read(splitter, filt, data, now)
                    if out:
                        if m.t_first_byte is None:
                            m.t_first_byte = now
                        saw_done = _ended(out, ends)
                        await send({"type": "http.response.body", "body": out,
                                    "more_body": True})
                    if watch.gone:
                        return "client_gone"
                    t = loop.time()
                    if t - rearmed >= 1.0:  # re-armed at most once a second: idle..idle+1 s
                        rearmed = t
                        deadline.reschedule(t + idle_timeout + 1.0)
                    data = await content.readany()
        except TimeoutError:
            outcome = "timeout"
            error = sse_error_event(504, f"upstream sent nothing for {idle_timeout:g}s",
                                    responses=responses)
        except (aiohttp.ClientError, OSError) as exc:
            if watch.gone:
                return "client_gone"
            outcome = "upstream_error"
            if watch.closing is not None:
                error = sse_error_event(503, watch.closing, responses=responses)
            else:
                error = sse_error_event(502, f"upstream connection lost: {type(exc).__name__}",
                                        responses=responses)
        if watch.gone:
            return "client_gone"
        outcome, error = check_end(outcome, error, saw_done, m, responses)
        if outcome != "ok" and resume is not None and watch.closing is None:
            resumed = await resume()
            resume = None  # once per request
            if resumed is not None:
                resp, data = resumed
                continue
        break
    return await end_stream(send, filt, outcome, error)


def filter_read(splitter: sse.FrameSplitter, filt: StreamFilter, data: bytes, now: float
                ) -> bytes:
    """One upstream read: its complete frames, through the filter; what the client gets."""
    frames = splitter.feed(data)
    if len(frames) == 1:
        return filt.frame(frames[0], now)
    return b"".join([filt.frame(f, now) for f in frames])


def check_end(outcome: str, error: bytes, ended: bool, m: Measurement, responses: bool
              ) -> tuple[str, bytes]:
    """A stream that stopped cleanly but without its end event was cut short all the same."""
    if outcome == "ok" and not ended and m.error is None:
        return "upstream_error", sse_error_event(
            502, "upstream stream ended before its end event", responses=responses)
    return outcome, error


async def end_stream(send: Send, filt: StreamFilter, outcome: str, error: bytes) -> str:
    """Send what is held back and the error event if any; the outcome, as recorded."""
    m = filt.m
    if error:
        m.error = m.error or error.decode(errors="replace")
    elif m.error is not None:
        outcome = "upstream_error"
    await send({"type": "http.response.body", "body": filt.release() + error,
                "more_body": False})
    return outcome


def _ended(out: bytes, ends: tuple[bytes, ...]) -> bool:
    if ends is CHAT_ENDS:
        return out.endswith((DONE, CRLF_DONE))
    body = out.replace(b"\r\n", b"\n") if b"\r\n" in out else out
    idx = body.rfind(b"\n\n", 0, len(body) - 2)
    last = body if idx < 0 else body[idx + 2 :]
    return last.startswith(ends)


async def relay_body(resp: aiohttp.ClientResponse, first: bytes, send: Send,
                     watch: DisconnectWatch, m: Measurement,
                     rename: tuple[bytes, bytes] | None, idle_timeout: float) -> str:
    """Relay a plain (non-streaming) body, keeping a bounded copy to read usage from."""
    copy = bytearray()
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout_at(loop.time() + idle_timeout) as deadline:
            data = first
            if rename is not None:
                # The model key sits in the first few hundred bytes: hold that much.
                while 0 < len(data) < 512:
                    more = await resp.content.readany()
                    if not more:
                        break
                    data += more
                data = data.replace(rename[0], rename[1], 1)
            while data:
                if len(copy) < _BODY_COPY_LIMIT:
                    copy += data
                if m.t_first_byte is None:
                    m.t_first_byte = time.perf_counter()
                await send({"type": "http.response.body", "body": data, "more_body": True})
                if watch.gone:
                    return "client_gone"
                deadline.reschedule(loop.time() + idle_timeout)
                data = await resp.content.readany()
    except TimeoutError:
        # Return without ending the body: the server closes the connection mid-body, so the
        # client sees a broken response, never a truncated one that looks complete.
        return "timeout"
    except (aiohttp.ClientError, OSError):
        return "client_gone" if watch.gone else "upstream_error"
    if watch.gone:
        return "client_gone"
    m.record_body(bytes(copy))
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return "ok" if resp.status < 400 else "upstream_error"
