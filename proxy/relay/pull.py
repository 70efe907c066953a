"""The pull relay: upstream bytes to the client as they arrive, measured, never buffered.

A pull loop (read upstream, filter, `send`) so backpressure flows end to end: a slow client
pauses uvicorn's `send`, which stops the reads, which closes the TCP window toward vLLM.
The upstream response is closed on every exit path; the client's disconnect is noticed by
proxy/relay/watch.py's `DisconnectWatch`, because uvicorn's `send` goes quiet rather than
failing once it is gone. It relays every plain (non-streaming) answer, and event streams
without our server's push channel or with `relay: pull`.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import aiohttp

from proxy.relay.asgi import Send
from proxy.relay.ends import body_outcome
from proxy.relay.exchange import Relay
from proxy.relay.measure import read_body
from proxy.relay.stream_core import StreamCore, open_core, ping_every
from proxy.relay.upstream import Payload, PulledResponse, UpstreamError, json_answer

if TYPE_CHECKING:
    from proxy.relay.exchange import Exchange

_BODY_COPY_LIMIT = 4 * 1024 * 1024  # non-streaming bodies kept for measurement up to this
BODY_CHECK_LIMIT = _BODY_COPY_LIMIT  # non-streaming JSON answers read whole up to this


async def open_pulled(
    x: Exchange[PulledResponse],
    url: str,
    payload: Payload,
    headers: dict[str, str],
    check_status: bool,
) -> tuple[PulledResponse, bytes]:
    """The request through the aiohttp session (the body's pieces joined for it); the
    response and its first body bytes."""
    watch = x.engine.watch
    resp = await watch.wait(x.gw.upstream.post(url, b"".join(payload), headers))
    x.decided.record.m.t_headers = time.perf_counter()
    watch.response = resp
    try:
        if resp.status >= 500 and check_status:
            raise UpstreamError("status", f"backend answered {resp.status}", resp.status)
        first = await resp.first_bytes()
        if x.body.get("stream") is not True and json_answer(resp.status, resp.headers):
            # Read whole (bounded) so that forward.py checks it is JSON before the status goes.
            first = await resp.read_whole(first, BODY_CHECK_LIMIT, x.gw.settings.idle_timeout_s)
        return resp, first
    except BaseException:
        resp.close()
        watch.response = None
        raise


async def relay_sse(x: Exchange[PulledResponse]) -> StreamCore | str:
    """Relay one engine's event stream: the stream core (proxy/relay/stream_core.py) driven
    by a pull loop, returned once the engine's stream is over (forward.py ends the client's
    stream, or has it continued); or the outcome `client_gone` when the client left.

    The response start has been sent. After the first byte there is no retry on this engine:
    the core says how its stream failed.
    """
    resp, data, watch = x.engine.resp, x.engine.first, x.engine.watch
    assert resp is not None
    send, every = x.send, ping_every(x)
    loop = asyncio.get_running_loop()
    content = resp.content
    rearmed = loop.time()
    core = open_core(x, rearmed)
    had_output = core.has_output
    try:
        async with asyncio.timeout_at(core.deadline(rearmed) + 1.0) as deadline:
            while data:
                out = core.feed(data, time.perf_counter())
                if core.failed:  # past the frame limit or the output bound
                    break
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                if watch.gone:
                    return core.gone()
                if core.stopped:  # a stop straddled the splice: the engine stops too
                    resp.close()
                    break
                t = loop.time()
                # Re-armed at most once a second (idle..idle+1 s), and at the first output.
                if t - rearmed >= 1.0 or had_output != core.has_output:
                    rearmed, had_output = t, core.has_output
                    deadline.reschedule(core.deadline(t) + 1.0)
                if every is None or core.has_output:
                    data = await content.readany()
                else:
                    data = await _read_pinging(content, core, send, every)
            tail = core.eof(time.perf_counter())  # nothing once failed
            if tail:
                await send({"type": "http.response.body", "body": tail, "more_body": True})
    except TimeoutError:
        core.silence()
    except (aiohttp.ClientError, OSError) as exc:
        if watch.gone:
            return "client_gone"
        if watch.closing is not None:
            core.lost(503, watch.closing)
        else:
            core.lost(502, f"upstream connection lost: {type(exc).__name__}")
    if watch.gone:
        return core.gone()
    return core


async def _read_pinging(
    content: aiohttp.StreamReader, core: StreamCore, send: Send, every: float
) -> bytes:
    """The next engine read, with a ping each `every` seconds of silence before it (between
    two reads, so between whole events)."""
    while True:
        try:
            async with asyncio.timeout(every):
                return await content.readany()
        except TimeoutError:
            ping = core.ping()
            if ping:
                await send({"type": "http.response.body", "body": ping, "more_body": True})


async def relay_body(x: Exchange[PulledResponse]) -> str:
    """Relay a plain (non-streaming) body, keeping a bounded copy to read usage from."""
    engine = x.engine
    resp, first, send, watch, m = (
        engine.resp,
        engine.first,
        x.send,
        engine.watch,
        x.decided.record.m,
    )
    assert resp is not None
    rename, idle_timeout, cut = x.plain.rename, x.gw.settings.idle_timeout_s, x.plain.cut
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
                if cut is not None:
                    data = cut.feed(data)
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
    read_body(m, bytes(copy))
    tail = b"" if cut is None else cut.end()
    await send({"type": "http.response.body", "body": tail, "more_body": False})
    return body_outcome(resp.status)


PULL = Relay(open_pulled, relay_sse, relay_body)
