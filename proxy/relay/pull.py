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

from proxy.relay import sse
from proxy.relay.continuation import stopped
from proxy.relay.ends import (
    MESSAGES_ENDS,
    RESPONSES_ENDS,
    at_end,
    body_outcome,
    check_end,
    end_stream,
    filter_read,
    finish_read,
    gone_outcome,
)
from proxy.relay.errors import sse_error_event
from proxy.relay.exchange import Relay
from proxy.relay.keepalive import silence_limit
from proxy.relay.resume import resume_stream
from proxy.relay.upstream import Payload, PulledResponse, UpstreamError

if TYPE_CHECKING:
    from proxy.relay.exchange import Exchange

_BODY_COPY_LIMIT = 4 * 1024 * 1024  # non-streaming bodies kept for measurement up to this


async def open_pulled(
    x: Exchange[PulledResponse],
    url: str,
    payload: Payload,
    headers: dict[str, str],
    check_status: bool,
) -> tuple[PulledResponse, bytes]:
    """The request through the aiohttp session (the body's pieces joined for it); the
    response and its first body bytes."""
    watch = x.watch
    resp = await watch.wait(x.gw.upstream.post(url, b"".join(payload), headers))
    x.record.m.t_headers = time.perf_counter()
    watch.response = resp
    try:
        if resp.status >= 500 and check_status:
            raise UpstreamError("status", f"backend answered {resp.status}", resp.status)
        return resp, await resp.first_bytes()
    except BaseException:
        resp.close()
        watch.response = None
        raise


async def relay_sse(x: Exchange[PulledResponse]) -> str:
    """Relay an event stream; returns the outcome: ok, client_gone, upstream_error, timeout.

    The response start has been sent. After the first byte there is no retry: a failing
    backend ends the stream with vLLM's error event and `[DONE]`, so no client hangs, unless
    `resume_stream` gives a continuation stream from another engine (proxy/relay/resume.py).
    """
    resp, data, send, watch, filt, ends = x.resp, x.first, x.send, x.watch, x.filt, x.ends
    assert resp is not None
    settings, resume = x.gw.settings, x.continuable
    max_frame = settings.max_sse_frame_bytes
    m = filt.m
    loop = asyncio.get_running_loop()
    responses, messages = ends is RESPONSES_ENDS, ends is MESSAGES_ENDS
    while True:
        # A dead upstream's partial frame is never sent; nor one past the frame limit.
        splitter = sse.FrameSplitter(max_frame)
        content = resp.content
        saw_done = False
        outcome = "ok"
        error = b""
        rearmed = loop.time()
        limit = silence_limit(m, settings, rearmed)
        had_output = m.t_first_token is not None
        try:
            async with asyncio.timeout_at(limit.due(rearmed, had_output) + 1.0) as deadline:
                while data:
                    now = time.perf_counter()
                    out = filter_read(splitter, filt, data, now)
                    if out:
                        saw_done = at_end(out, ends)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                    if watch.gone:
                        return gone_outcome(saw_done)
                    if stopped(filt):  # a stop straddled the splice: the engine stops too
                        resp.close()
                        break
                    t = loop.time()
                    # Re-armed at most once a second (idle..idle+1 s), and at the first output.
                    if t - rearmed >= 1.0 or had_output != (m.t_first_token is not None):
                        rearmed, had_output = t, m.t_first_token is not None
                        deadline.reschedule(limit.due(t, had_output) + 1.0)
                    data = await content.readany()
                tail = finish_read(splitter, filt, time.perf_counter())
                if tail:
                    saw_done = at_end(tail, ends)
                    await send({"type": "http.response.body", "body": tail, "more_body": True})
        except sse.FrameTooLarge as exc:
            outcome = "upstream_error"
            error = sse_error_event(502, f"upstream {exc}", responses=responses)
        except TimeoutError:
            outcome = "timeout"
            error = sse_error_event(
                504,
                limit.message(m.t_first_token is not None),
                responses=responses,
                messages=messages,
            )
        except (aiohttp.ClientError, OSError) as exc:
            if watch.gone:
                return "client_gone"
            outcome = "upstream_error"
            if watch.closing is not None:
                error = sse_error_event(503, watch.closing, responses=responses, messages=messages)
            else:
                error = sse_error_event(
                    502,
                    f"upstream connection lost: {type(exc).__name__}",
                    responses=responses,
                    messages=messages,
                )
        if watch.gone:
            return gone_outcome(saw_done, outcome)
        outcome, error = check_end(outcome, error, saw_done, m, responses, messages)
        if outcome != "ok" and resume and watch.closing is None:
            resumed = await resume_stream(x)
            resume = False  # once per request
            if resumed is not None:
                resp, data = resumed
                continue
        break
    # A client that reads nothing ran the idle deadline out above; its last event must not
    # wait for it without end (uvicorn's `send` waits for the socket to drain).
    try:
        async with asyncio.timeout(x.gw.settings.client_write_timeout_s):
            return await end_stream(send, filt, outcome, error)
    except TimeoutError:
        return "client_gone"


async def relay_body(x: Exchange[PulledResponse]) -> str:
    """Relay a plain (non-streaming) body, keeping a bounded copy to read usage from."""
    resp, first, send, watch, m = x.resp, x.first, x.send, x.watch, x.record.m
    assert resp is not None
    rename, idle_timeout = x.rename, x.gw.settings.idle_timeout_s
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
    return body_outcome(resp.status)


PULL = Relay(open_pulled, relay_sse, relay_body)
