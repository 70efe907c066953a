"""Per-request measurement, and the sans-io filter that reads (and trims) each relayed frame.

The gateway asks vLLM for continuous usage so it can count tokens per chunk; `StreamFilter`
takes those additions back out so the client's bytes are what vLLM would have sent for the
client's own request. It does no I/O and reads no clock: the relay passes `now` in.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.relay import sse
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


@dataclass(slots=True)
class Measurement:
    """What one request did, as the gateway saw it. Times are monotonic seconds."""

    t_start: float
    t_first_byte: float | None = None  # first frame sent to the client (TTFT)
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_end: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    completion_tokens: int = 0
    chunks: int = 0  # choice frames seen
    # Per decode chunk, as typed arrays: 12 bytes a chunk instead of ~40 (a float object and two
    # list slots); `gw.recent` keeps 200 finished requests with theirs.
    step_gaps: array[float] = field(default_factory=lambda: array("d"))
    step_tokens: array[int] = field(default_factory=lambda: array("I"))
    spec: dict[str, Any] | None = None  # vLLM's metrics.speculative_decoding, when reported
    finish_reason: str | None = None
    error: str | None = None  # an upstream error event's message

    @property
    def ttft(self) -> float | None:
        return None if self.t_first_byte is None else self.t_first_byte - self.t_start

    @property
    def e2e(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_start

    @property
    def acceptance(self) -> float | None:
        """Accepted tokens per target step: exact when the engine reported it, else measured."""
        if self.spec is not None:
            value = self.spec.get("mean_acceptance_length")
            if isinstance(value, int | float):
                return float(value)
        if not self.step_tokens:
            return None
        return sum(self.step_tokens) / len(self.step_tokens)

    @property
    def accepted_and_steps(self) -> tuple[int, int] | None:
        """(accepted draft tokens, target steps), to aggregate acceptance over many requests."""
        if self.spec is not None:
            acc, steps = self.spec.get("num_accepted_draft_tokens"), self.spec.get("num_spec_steps")
            if isinstance(acc, int) and isinstance(steps, int):
                return acc, steps
        if not self.step_tokens:
            return None
        return sum(self.step_tokens) - len(self.step_tokens), len(self.step_tokens)

    def itl_per_token(self) -> list[float]:
        out: list[float] = []
        for gap, tokens in zip(self.step_gaps, self.step_tokens, strict=True):
            out.extend([gap / tokens] * tokens)
        return out

    def record_tokens(self, total: int, now: float) -> None:
        """A choice frame reported `total` completion tokens so far."""
        delta = total - self.completion_tokens
        if delta <= 0:
            return
        self.completion_tokens = total
        if self.t_last_token is None:
            self.t_first_token = now  # the prefill step's token: not a decode step
        else:
            self.step_gaps.append(now - self.t_last_token)
            self.step_tokens.append(delta)
        self.t_last_token = now

    def record_usage(self, usage: dict[str, Any]) -> None:
        prompt = usage.get("prompt_tokens")
        if isinstance(prompt, int):
            self.prompt_tokens = prompt
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            self.cached_tokens = details["cached_tokens"]
        completion = usage.get("completion_tokens")
        if isinstance(completion, int) and completion > self.completion_tokens:
            self.completion_tokens = completion

    def record_body(self, body: bytes) -> None:
        """A whole non-streaming JSON response: usage, finish reason, spec metrics."""
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return
        if not isinstance(obj, dict):
            return
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.record_usage(usage)
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            reason = choices[0].get("finish_reason")
            self.finish_reason = reason if isinstance(reason, str) else None
        self._record_metrics(obj)
        if isinstance(obj.get("error"), dict):
            self.error = str(obj["error"].get("message"))

    def _record_metrics(self, obj: dict[str, Any]) -> None:
        metrics = obj.get(METRICS)
        if isinstance(metrics, dict) and isinstance(metrics.get(SPEC_DECODING), dict):
            self.spec = metrics[SPEC_DECODING]


class StreamFilter:
    """Reads every SSE frame of a chat/completions stream; returns the bytes the client gets.

    `strip_usage`: the client did not ask for continuous usage, so per-chunk `usage` goes.
    `drop_usage_chunk`: the client did not ask for usage at all, so the final usage chunk goes;
    vLLM then puts `system_fingerprint` on the finish chunk instead, so the finish chunk is held
    until the usage chunk (which follows it at once) hands its fingerprint over.
    """

    __slots__ = ("m", "strip_usage", "drop_usage_chunk", "rename", "_held")

    def __init__(
        self,
        m: Measurement,
        *,
        strip_usage: bool = False,
        drop_usage_chunk: bool = False,
        rename: tuple[bytes, bytes] | None = None,
    ) -> None:
        self.m = m
        self.strip_usage = strip_usage
        self.drop_usage_chunk = drop_usage_chunk
        self.rename = rename
        self._held = b""

    def frame(self, frame: bytes, now: float) -> bytes:
        if self.rename is not None:
            frame = frame.replace(self.rename[0], self.rename[1])
        if frame.startswith(COMMENT):
            return frame  # vLLM's `: keep-alive`: no event, so a held frame stays held
        if not frame.startswith(DATA_OBJECT):
            return self.release() + frame  # [DONE], or anything we do not interpret
        if frame.startswith(ERROR_FRAME_PREFIX):
            self._record_error(frame)
            return self.release() + frame
        span = sse.usage_span(frame)
        empty_choices = _EMPTY_CHOICES in frame
        finish = not empty_choices and _FINISH in frame
        if not empty_choices:
            self.m.chunks += 1
            if finish:
                self._record_finish(frame)
        if span is None:
            if not empty_choices and self.m.t_first_token is None:
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
        total = usage.get("completion_tokens")
        if isinstance(total, int):
            self.m.record_tokens(total, now)
        if self.m.prompt_tokens is None:  # the same on every chunk; the usage chunk has all
            self.m.record_usage(usage)
        if self.strip_usage:
            frame = sse.cut(frame, span)
        if self.drop_usage_chunk and finish:
            self._held += frame
            return b""
        return frame

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
                self.m._record_metrics(obj)
        if not self.drop_usage_chunk:
            return self.release() + frame
        fp = sse.fingerprint_span(frame)
        held = self.release()
        if fp is not None and held:
            # The held frame finished the only choice (n == 1): its object closes at its last
            # `}`, whatever line ending the stream uses.
            held = sse.insert_before_close(held, frame[fp[0] : fp[1]])
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
