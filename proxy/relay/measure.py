"""The sans-io filter that reads (and trims) each relayed frame into the request's measurement
(proxy/record/measure.py), and the reading of a whole non-streaming answer.

The gateway asks vLLM for continuous usage so it can count tokens per chunk; `StreamFilter`
takes those additions back out so the client's bytes are what vLLM would have sent for the
client's own request. It does no I/O and reads no clock: the relay passes `now` in.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from policies.capabilities import TIMINGS_KEY
from proxy.bounds import token_count
from proxy.record.measure import Measurement
from proxy.relay import llamacpp, sglang, sse
from proxy.vllm_wire import (
    COMMENT,
    DATA_OBJECT,
    ERROR_FRAME_PREFIX,
    METRICS,
    SPEC_DECODING,
    USAGE_KEY,
)

_USAGE_OFFSET = len(USAGE_KEY) - 1  # where the usage object's `{` starts in the span
_FINISH = b'"finish_reason":"'
_EMPTY_CHOICES = b'"choices":[]'
_TOOL_CALLS = b'"tool_calls":[{'
# vLLM 0.33 ends every non-role chunk with it, after `system_fingerprint`.
_KV_NULL = b',"kv_transfer_params":null}'


def read_body(m: Measurement, body: bytes) -> None:
    """A whole non-streaming JSON response: usage, finish reason, spec metrics."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    if not isinstance(obj, dict):
        return
    usage = obj.get("usage")
    if isinstance(usage, dict):
        m.record_usage(usage)
    choices = obj.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        reason = choices[0].get("finish_reason")
    else:  # Messages' stop_reason, Responses' incomplete reason or status
        details = obj.get("incomplete_details")
        reason = obj.get("stop_reason") or (
            details.get("reason") if isinstance(details, dict) else obj.get("status")
        )
    m.finish_reason = reason if isinstance(reason, str) else None
    if obj.get("object") == "response" and isinstance(obj.get("id"), str):
        m.response_id = obj["id"]
    read_metrics(m, obj)
    if isinstance(obj.get("error"), dict):
        m.error = str(obj["error"].get("message"))


def read_metrics(m: Measurement, obj: dict[str, Any]) -> None:
    timings = obj.get(TIMINGS_KEY)
    if isinstance(timings, dict):
        llamacpp.record_timings(m, timings)
    metrics = obj.get(METRICS)
    if isinstance(metrics, dict) and isinstance(metrics.get(SPEC_DECODING), dict):
        m.spec = metrics[SPEC_DECODING]
    spec = sglang.spec_of(obj)  # SGLang's `sglext`, on the keys of vLLM's summary
    if spec is not None:
        m.spec = spec


class EventReader(Protocol):
    """A typed event stream's reader (proxy/relay/events.py): `StreamFilter` hands it the frames
    it does not interpret itself."""

    def read(self, frame: bytes, now: float) -> None: ...


class StreamFilter:
    """Reads every SSE frame of a chat/completions stream; returns the bytes the client gets.

    `strip_usage`: the client did not ask for continuous usage, so per-chunk `usage` goes.
    `drop_usage_chunk`: the client did not ask for usage at all, so the final usage chunk goes;
    vLLM then puts `system_fingerprint` on the finish chunk instead, so the finish chunk is held
    until the usage chunk (which follows it at once) hands its fingerprint over.
    `engine_timings`: a llama.cpp stream (proxy/relay/llamacpp.py): one token per frame, the
    engine's own `timings` on the last; nothing is cut.
    `events`: the reader of a typed event stream (proxy/relay/events.py), given every frame
    that is not a `data:` object; it only reads.
    """

    __slots__ = (
        "m",
        "strip_usage",
        "drop_usage_chunk",
        "rename",
        "engine_timings",
        "events",
        "_held",
    )

    def __init__(
        self,
        m: Measurement,
        *,
        strip_usage: bool = False,
        drop_usage_chunk: bool = False,
        rename: tuple[bytes, bytes] | None = None,
        engine_timings: bool = False,
        events: EventReader | None = None,
    ) -> None:
        self.m = m
        self.engine_timings = engine_timings
        self.strip_usage = strip_usage
        self.drop_usage_chunk = drop_usage_chunk
        self.rename = rename
        self.events = events
        self._held = b""
        if engine_timings:
            m.estimate_void = "token_frames"  # one frame per token, not per step

    def frame(self, frame: bytes, now: float) -> bytes:
        if self.rename is not None:
            frame = frame.replace(self.rename[0], self.rename[1])
        if frame.startswith(COMMENT):
            return frame  # vLLM's `: keep-alive`: no event, so a held frame stays held
        if not frame.startswith(DATA_OBJECT):
            if self.events is not None:
                self.events.read(frame, now)
            return self.release() + frame  # [DONE], a typed event, a comment: untouched
        if frame.startswith(ERROR_FRAME_PREFIX):
            self._record_error(frame)
            return self.release() + frame
        if self.engine_timings:
            self._engine_frame(frame, now)
        span = sse.usage_span(frame)
        empty_choices = _EMPTY_CHOICES in frame
        finish = not empty_choices and _FINISH in frame
        if not empty_choices:
            self.m.chunks += 1
            if finish:
                self._record_finish(frame)
            if _TOOL_CALLS in frame and self.m.estimate_void is None:
                self.m.estimate_void = "tool_calls"  # a tool-call parser buffers tokens
        if span is None:  # no token counts: the first frame with generated text is the first token
            if not empty_choices and self.m.t_first_token is None and _carries_token(frame):
                self.m.t_first_token = now
            return frame
        try:
            usage = orjson.loads(frame[span[0] + _USAGE_OFFSET : span[1]])
        except orjson.JSONDecodeError:
            return self.release() + frame  # not vLLM's usage: relay it untouched, measure nothing
        if not isinstance(usage, dict):
            return self.release() + frame
        if empty_choices:
            return self._usage_chunk(frame, usage)
        total = token_count(usage.get("completion_tokens"))
        if total is not None:
            self.m.record_tokens(total, now)
        if self.m.prompt_tokens is None:  # the same on every chunk; the usage chunk has all
            self.m.record_usage(usage)
        if self.strip_usage:
            frame = sse.cut(frame, span)
        if self.drop_usage_chunk and finish:
            self._held += frame
            return b""
        return frame

    def _engine_frame(self, frame: bytes, now: float) -> None:
        if llamacpp.is_token_frame(frame):
            self.m.record_tokens(self.m.completion_tokens + 1, now)
        timings = llamacpp.frame_timings(frame)
        if timings is not None:
            llamacpp.record_timings(self.m, timings)

    def release(self) -> bytes:
        """Frames held back, to send now (at the end of the stream at the latest)."""
        held, self._held = self._held, b""
        return held

    def _usage_chunk(self, frame: bytes, usage: dict[str, Any]) -> bytes:
        self.m.record_usage(usage)
        if b'"metrics":' in frame:
            try:
                obj = orjson.loads(frame[6:])
            except orjson.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                read_metrics(self.m, obj)
        if not self.drop_usage_chunk:
            return self.release() + frame
        fp = sse.fingerprint_span(frame)
        held = self.release()
        if fp is not None and held:
            # The held frame finished the only choice (n == 1): its object closes at its last
            # `}`, whatever line ending the stream uses.
            held = _put_fingerprint(held, frame[fp[0] : fp[1]])
        return held

    def _record_finish(self, frame: bytes) -> None:
        start = frame.find(_FINISH) + len(_FINISH)
        self.m.finish_reason = frame[start : frame.find(b'"', start)].decode(errors="replace")

    def _record_error(self, frame: bytes) -> None:
        try:
            obj = orjson.loads(frame[6:])
            self.m.error = str(obj["error"].get("message"))
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            self.m.error = "unparsable error event"


def withhold_estimate(m: Measurement, body: dict[str, Any], num_spec_tokens: int | None) -> None:
    """Before a stream is relayed: what the policy and the client's body say about chunks.

    A client's `stream_interval` is passed to vLLM as sent (the client asked for that chunking;
    the gateway does not change what vLLM sends for the client's request), so above 1 the
    chunk estimate is withheld; the engine's per-request summary (0.29+) still counts.
    """
    # A policy without the backend's speculative config does not say what a step can give.
    m.max_step_tokens = None if num_spec_tokens is None else num_spec_tokens + 1
    interval = body.get("stream_interval")
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > 1:
        m.estimate_void = "stream_interval"


def _put_fingerprint(held: bytes, piece: bytes) -> bytes:
    """Where vLLM writes it: last in the object, before 0.33's `kv_transfer_params`."""
    end = held.rstrip()
    if end.endswith(_KV_NULL):
        cut = len(end) - len(_KV_NULL)
        return held[:cut] + piece + held[cut:]
    return sse.insert_before_close(held, piece)


def _carries_token(frame: bytes) -> bool:
    """Whether a choice frame holds generated text, reasoning or tool-call arguments (not a
    role-only chunk). Parsed only until the first such frame."""
    try:
        obj = orjson.loads(frame[6:])
    except orjson.JSONDecodeError:
        return False
    for choice in obj.get("choices") or () if isinstance(obj, dict) else ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
            or delta.get("tool_calls")
        ):
            return True
        if choice.get("text"):
            return True
    return False
