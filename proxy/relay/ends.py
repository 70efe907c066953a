"""How a relayed event stream ends, shared by both relays (proxy/relay/pull.py, push.py): its
frames filtered read by read, its end event recognised, and what the client gets last."""

from __future__ import annotations

from proxy.record.measure import Measurement
from proxy.relay import sse
from proxy.relay.asgi import Send
from proxy.relay.errors import sse_error_event
from proxy.relay.measure import StreamFilter
from proxy.vllm_wire import COMMENT, CRLF_DONE, DONE

CR_DONE = CRLF_DONE.replace(b"\r\n", b"\r")  # an upstream framing with CR alone (SSE allows it)

# How a complete stream ends: vLLM's `[DONE]`, or on /v1/responses a terminal event; on
# /v1/messages `message_stop`, or vLLM's `error` event (it sends nothing after one).
CHAT_ENDS = (DONE,)
RESPONSES_ENDS = (
    b"event: response.completed",
    b"event: response.incomplete",
    b"event: response.failed",
)
MESSAGES_ENDS = (b"event: message_stop", b"event: error")


def filter_read(splitter: sse.FrameSplitter, filt: StreamFilter, data: bytes, now: float) -> bytes:
    """One upstream read: its complete frames, through the filter; what the client gets. The
    first frame that is not a comment (vLLM's `: keep-alive`) is the stream's first byte."""
    frames = splitter.feed(data)
    if filt.m.t_first_byte is None and any(not f.startswith(COMMENT) for f in frames):
        filt.m.t_first_byte = now
    if len(frames) == 1:
        return filt.frame(frames[0], now)
    return b"".join([filt.frame(f, now) for f in frames])


def finish_read(splitter: sse.FrameSplitter, filt: StreamFilter, now: float) -> bytes:
    """The upstream ended cleanly: a last frame the splitter still held, through the filter."""
    return b"".join([filt.frame(f, now) for f in splitter.finish()])


def at_end(out: bytes, ends: tuple[bytes, ...]) -> bool:
    """Whether what was just sent finishes with the stream's end event."""
    if ends is CHAT_ENDS:
        return out.endswith((DONE, CRLF_DONE, CR_DONE))
    body = out.replace(b"\r\n", b"\n").replace(b"\r", b"\n") if b"\r" in out else out
    idx = body.rfind(b"\n\n", 0, len(body) - 2)
    last = body if idx < 0 else body[idx + 2 :]
    return last.startswith(ends)


def body_outcome(status: int) -> str:
    """A whole body's outcome by its status: an engine's 4xx is the client's error (a prompt too
    long, a bad field), not the engine failing; 408 and 429 are the engine's."""
    if status < 400:
        return "ok"
    return "client_error" if status < 500 and status not in (408, 429) else "upstream_error"


def check_end(
    outcome: str, error: bytes, ended: bool, m: Measurement, responses: bool, messages: bool = False
) -> tuple[str, bytes]:
    """A stream that stopped cleanly but without its end event was cut short all the same."""
    if outcome == "ok" and not ended and m.error is None:
        return "upstream_error", sse_error_event(
            502,
            "upstream stream ended before its end event",
            responses=responses,
            messages=messages,
        )
    return outcome, error


def gone_outcome(ended: bool, outcome: str = "ok") -> str:
    """The outcome of a stream whose client hung up: after the end event it had the whole
    answer (an SDK closes its connection as soon as it reads `[DONE]`, which can be before the
    engine's own stream has closed), so the request finished; before it, the client is gone."""
    return "ok" if ended and outcome == "ok" else "client_gone"


async def end_stream(send: Send, filt: StreamFilter, outcome: str, error: bytes) -> str:
    """Send what is held back and the error event if any; the outcome, as recorded."""
    m = filt.m
    if error:
        m.error = m.error or error.decode(errors="replace")
    elif m.error is not None:
        outcome = "upstream_error"
    await send({"type": "http.response.body", "body": filt.release() + error, "more_body": False})
    return outcome


async def end_with_error(send: Send, endpoint: str, status: int, message: str) -> None:
    """A stream whose headers went out (keepalive pings) and that no engine could serve: the
    engine-style error event (with `[DONE]` on chat and completions) ends it."""
    error = sse_error_event(
        status, message, responses=endpoint == "responses", messages=endpoint == "messages"
    )
    await send({"type": "http.response.body", "body": error, "more_body": False})
