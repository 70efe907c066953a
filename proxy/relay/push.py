"""The push relay: engine bytes written to the client from the read callback itself.

The pull loop (proxy/relay/pull.py) costs, per relayed chunk, a future and a task wake-up for the
upstream read, aiohttp's payload machinery and an ASGI `send` round trip; at 16 paced streams
that is ~150 us of CPU per chunk on the 2-core box, against ~40 us for nginx. Here the engine's
stream is read by a raw asyncio protocol (httptools parses the response), and each read is
framed, filtered and written to the client's transport inside `data_received`: no task runs
per chunk. Backpressure is explicit: when the client's transport pauses writing, the engine's
transport pauses reading.

Two halves: `PushChannel` (proxy/relay/channel.py), an ASGI extension that our server protocol (proxy/servers.py) puts in
the scope (`scope["extensions"]["specrouter.push"]`) to write chunked body bytes straight to the
client's transport after the response start went through ASGI; and `EngineStream`
(proxy/relay/engine_conn.py), one streaming response from an engine on a kept-alive connection.
Without the extension (another ASGI server) the gateway uses the pull loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.relay.channel import PushChannel
from proxy.relay.ends import body_outcome
from proxy.relay.engine_conn import EngineStream, open_engine_stream
from proxy.relay.exchange import Relay
from proxy.relay.measure import read_body
from proxy.relay.stream_core import StreamCore, open_core, ping_every
from proxy.relay.upstream import Payload, UpstreamError

if TYPE_CHECKING:
    from proxy.relay.exchange import Exchange


Sink = Callable[[bytes], None]


async def open_pushed(
    x: Exchange[EngineStream],
    url: str,
    payload: Payload,
    headers: dict[str, str],
    check_status: bool,
) -> tuple[EngineStream, bytes]:
    """The request on a kept-alive engine connection; the response and its first body bytes."""
    watch = x.engine.watch
    stream, first = await watch.wait(_open_stream(x, url, payload, headers, check_status))
    watch.response = stream
    return stream, first


async def _open_stream(
    x: Exchange[EngineStream],
    url: str,
    payload: Payload,
    headers: dict[str, str],
    check_status: bool,
) -> tuple[EngineStream, bytes]:
    gw = x.gw
    settings = gw.settings
    stream: EngineStream | None = None
    sent: list[bool] = []
    deadlines = gw.first_byte
    deadline = deadlines.start()  # the first-byte timeout (proxy/relay/deadlines.py)
    try:
        stream = await open_engine_stream(
            gw.conns, url, payload, headers, settings.connect_timeout_s, sent
        )
        x.decided.record.m.t_headers = time.perf_counter()
        try:
            if stream.status >= 500 and check_status:
                raise UpstreamError("status", f"backend answered {stream.status}", stream.status)
            return stream, await stream.first_bytes()
        except BaseException:
            stream.close()
            raise
    except asyncio.CancelledError as exc:
        if not deadlines.expired(deadline):
            raise
        # Once written, the request is the engine's (it may be generating without having sent
        # its head yet): it is not sent again, to this variant or another.
        raise UpstreamError(
            "timeout",
            f"no first byte in {deadlines.seconds:g}s",
            accepted=stream is not None or bool(sent),
        ) from exc
    finally:
        deadlines.end(deadline)


async def relay_sse_push(x: Exchange[EngineStream]) -> StreamCore | str:
    """The stream core (proxy/relay/stream_core.py) driven from the engine's read callbacks:
    pull.relay_sse's contract (the core once the engine's stream is over, or the outcome when
    the client left)."""
    stream, first, channel = x.engine.resp, x.engine.first, x.engine.channel
    assert stream is not None and channel is not None  # PUSH is chosen with a channel only
    watch = x.engine.watch
    write_timeout = x.gw.settings.client_write_timeout_s
    every = ping_every(x)
    loop = asyncio.get_running_loop()
    core = open_core(x, loop.time())
    draining: list[asyncio.Task[None]] = []  # non-empty while paused for the client
    paused_at = [0.0]

    def sink(
        data: bytes,
        stream: EngineStream = stream,
        core: StreamCore = core,
        draining: list[asyncio.Task[None]] = draining,
        paused_at: list[float] = paused_at,
    ) -> None:
        t = time.perf_counter()
        out = core.feed(data, t) if data else core.eof(t)
        if core.failed:  # past the frame limit or the output bound: the rest is not read
            stream.abort(UpstreamError("frame", "stream cut by its core"))
            return
        if not out:
            return
        if core.stopped:  # a stop straddled the splice: closing aborts the engine's rest
            channel.write(out)
            stream.close()
            return
        if core.ended and not draining:  # the end event: out with the chunked end, one write
            channel.hold_last(out)
            loop.call_soon(_flush_unless_done, channel, stream)
            return
        if channel.write(out) and not draining:
            # The client reads slower than the engine writes: stop reading the engine
            # until the client's socket drains (TCP then pushes back on the engine).
            stream.pause()
            paused_at[0] = loop.time()
            draining.append(loop.create_task(_resume_after_drain(channel, stream, draining)))

    if first:
        sink(first)
    stream.attach(sink)
    pending = stream.take_pending()
    if pending:
        sink(pending)
    if not stream.done.done():  # held for the first event (forward.py); never across a wait
        channel.flush_head()
    pinged = loop.time()
    try:
        while not stream.done.done():
            now = loop.time()
            if draining:  # the client's socket is full: its reading is what is awaited
                remaining = paused_at[0] + write_timeout - now
                if remaining <= 0:
                    raise _ClientStalled
            else:
                remaining = core.deadline(stream.last_activity) - now
                if remaining <= 0:
                    raise TimeoutError
                if every is not None and not core.has_output:
                    pinged = max(pinged, stream.last_activity)
                    if now - pinged >= every:  # between two reads: between whole events
                        channel.write(core.ping())
                        pinged = now
                    remaining = min(remaining, pinged + every - now)
            # Woken at least once an idle timeout: a first output moves the deadline nearer.
            await asyncio.wait({stream.done}, timeout=max(min(remaining, core.limit.idle), 0.05))
        failure = _failure(stream)
        if failure is None or core.stopped:  # stopped: the gateway closed it at the stop
            sink(b"")  # the clean end: a last frame held back for a `\n` that never came
        elif watch.closing is not None:
            core.lost(503, watch.closing)
        else:
            core.lost(502, f"upstream {failure}")
    except _ClientStalled:
        # Nothing read for write_timeout: the client holds the engine's slot without using
        # it. Its connection is closed; closing the stream (below) aborts the engine's work.
        channel.abort()
        return "client_gone"
    except TimeoutError:
        core.silence()
    finally:
        for task in draining:
            task.cancel()
        stream.close()
    if watch.gone or channel.gone:
        return core.gone()
    return core


class _ClientStalled(Exception):
    """The client read nothing for `client_write_timeout_s` while the relay waited for it."""


def _failure(stream: EngineStream) -> UpstreamError | None:
    """How a finished stream failed, read rather than raised: raising would put the relay's
    frame, and the whole request with it, in the traceback of an exception the stream's
    futures keep, a cycle that only a full collection frees."""
    failure = stream.done.exception()
    if failure is None or isinstance(failure, UpstreamError):
        return failure
    raise failure  # not the engine's: as `result()` would


def _flush_unless_done(channel: PushChannel, stream: EngineStream) -> None:
    """A held end event waits for the engine's end only if it came in the same read."""
    if not stream.done.done():
        channel.flush_head()


async def _resume_after_drain(
    channel: PushChannel, stream: EngineStream, draining: list[asyncio.Task[None]]
) -> None:
    try:
        await channel.drain()
        stream.last_activity = asyncio.get_running_loop().time()
        stream.resume()
    finally:
        draining.clear()


async def relay_body_push(x: Exchange[EngineStream]) -> str:
    """A plain body (an engine's error answer to a streaming request), pushed as it comes."""
    stream, first, channel, send = x.engine.resp, x.engine.first, x.engine.channel, x.send
    assert stream is not None and channel is not None
    watch, m, idle_timeout = x.engine.watch, x.decided.record.m, x.gw.settings.idle_timeout_s
    copy = bytearray(first)

    def sink(data: bytes) -> None:
        if len(copy) < 1 << 20:
            copy.extend(data)
        channel.write(data)

    if first:
        channel.write(first)
    stream.attach(sink)
    pending = stream.take_pending()
    if pending:
        sink(pending)
    loop = asyncio.get_running_loop()
    try:
        while not stream.done.done():
            remaining = stream.last_activity + idle_timeout - loop.time()
            if remaining <= 0:
                return "timeout"  # the body is left unended: the client sees it broken
            await asyncio.wait({stream.done}, timeout=remaining)
        if _failure(stream) is not None:
            return "client_gone" if watch.gone else "upstream_error"
    finally:
        stream.close()
    if m.t_first_byte is None:
        m.t_first_byte = time.perf_counter()
    read_body(m, bytes(copy))
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return body_outcome(stream.status)


PUSH = Relay(open_pushed, relay_sse_push, relay_body_push)
