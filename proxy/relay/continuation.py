"""Mid-stream continuation: when an engine dies after part of a chat answer was streamed,
another variant of the same weights finishes it in the same stream.

Speculative decoding preserves the target model's distribution, so text continued by a
variant with another drafter is still a sample of the same model; the continuation is
conditioned on the partial answer exactly as if the first engine had gone on (vLLM's
`continue_final_message`; llama.cpp continues a final assistant message unasked). That holds
only for the same weights on the same kind of engine (two engines' kernels and samplers are not
the same distribution), so a variant of another kind or model is refused, and counted. Only for
one choice, no tool calls in flight, tokens already sent counted (so `max_tokens` holds across
the splice), once per request.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from policies.spec.backends import BackendSpec
from proxy.relay import sse
from proxy.relay.measure import Measurement, StreamFilter
from proxy.vllm_wire import DATA_OBJECT, ERROR_FRAME_PREFIX, USAGE_KEY

_CREATED = re.compile(rb'"created":\d+')
# A role chunk, whatever its content: vLLM's `""`, llama.cpp's `null`, or none at all.
_ROLE_CHUNK = re.compile(rb'"delta":\{"role":"[^"]*"(,"content":(""|null))?\}')
_USAGE_OFFSET = len(USAGE_KEY) - 1


class ContinuableFilter(StreamFilter):
    """A StreamFilter that remembers what the client has received, and can then splice a
    continuation stream into the same response (same id, created and model; no second role
    chunk; token counts carried on)."""

    __slots__ = (
        "eligible",
        "text",
        "orig_id",
        "orig_created",
        "cont_id",
        "offset",
        "prompt_tokens",
        "continuing",
    )

    def __init__(self, m: Measurement, **kw: Any) -> None:
        super().__init__(m, **kw)
        self.eligible = True
        self.text: list[str] = []
        self.orig_id: bytes | None = None
        self.orig_created: bytes | None = None
        self.cont_id: bytes | None = None
        self.offset = 0
        self.prompt_tokens: int | None = None
        self.continuing = False

    def frame(self, frame: bytes, now: float) -> bytes:
        if not frame.startswith(DATA_OBJECT) or frame.startswith(ERROR_FRAME_PREFIX):
            return super().frame(frame, now)
        if self.continuing:
            frame = self._splice(frame)
            if not frame:
                return b""
        else:
            self._remember(frame)
        return super().frame(frame, now)

    def _remember(self, frame: bytes) -> None:
        if not self.eligible:
            return
        try:
            obj = orjson.loads(frame[6:])
        except orjson.JSONDecodeError:
            self.eligible = False
            return
        if self.orig_id is None:
            self.orig_id = str(obj.get("id", "")).encode()
            self.orig_created = b'"created":' + str(obj.get("created", 0)).encode()
        choices = obj.get("choices") or []
        if len(choices) != 1:
            return  # the usage chunk
        delta = choices[0].get("delta") or {}
        if delta.get("tool_calls") or delta.get("reasoning") or choices[0].get("index", 0):
            self.eligible = False  # a tool call or reasoning in flight cannot be continued
            return
        content = delta.get("content")
        if isinstance(content, str):
            self.text.append(content)

    def partial(self) -> str:
        return "".join(self.text)

    def start_continuation(self) -> None:
        self.continuing = True
        self.eligible = False  # once per request
        self.offset = self.m.completion_tokens
        self.prompt_tokens = self.m.prompt_tokens

    def _splice(self, frame: bytes) -> bytes:
        if self.cont_id is None:
            start = frame.find(b'"id":"') + 6
            self.cont_id = frame[start : frame.find(b'"', start)]
        if _ROLE_CHUNK.search(frame):
            return b""  # the continuation's own role chunk: the client already has one
        if self.orig_id is not None and self.cont_id:
            frame = frame.replace(
                b'"id":"' + self.cont_id + b'"', b'"id":"' + self.orig_id + b'"', 1
            )
        if self.orig_created is not None:
            frame = _CREATED.sub(self.orig_created, frame, count=1)
        span = sse.usage_span(frame)
        if span is not None and self.offset:
            usage = orjson.loads(frame[span[0] + _USAGE_OFFSET : span[1]])
            completion = int(usage.get("completion_tokens", 0)) + self.offset
            prompt = (
                self.prompt_tokens
                if self.prompt_tokens is not None
                else int(usage.get("prompt_tokens", 0))
            )
            fixed = {
                **usage,
                "prompt_tokens": prompt,
                "total_tokens": prompt + completion,
                "completion_tokens": completion,
            }
            frame = frame[: span[0]] + b',"usage":' + orjson.dumps(fixed) + frame[span[1] :]
        return frame


def continuation_body(body: dict[str, Any], partial: str, generated: int) -> dict[str, Any]:
    """The request that makes another engine finish the answer where it stopped."""
    out = dict(body)
    out["messages"] = [*body.get("messages", []), {"role": "assistant", "content": partial}]
    out["continue_final_message"] = True
    out["add_generation_prompt"] = False
    for key in ("max_tokens", "max_completion_tokens"):
        if isinstance(out.get(key), int):
            out[key] = max(1, out[key] - generated)
    return out


def can_continue(body: dict[str, Any], filt: StreamFilter) -> bool:
    # Without a count of the tokens sent (an engine that reports none per chunk) a continuation
    # could not honour max_tokens: it would grant the whole budget again.
    counted = filt.m.completion_tokens > 0 or not any(
        isinstance(body.get(k), int) for k in ("max_tokens", "max_completion_tokens")
    )
    return (
        isinstance(filt, ContinuableFilter)
        and filt.eligible
        and bool(filt.text)
        and counted
        and body.get("n", 1) in (1, None)
        and isinstance(body.get("messages"), list)
    )


def continuation_refused(failed: BackendSpec, other: BackendSpec) -> str | None:
    """Why `other` may not continue a stream `failed` began (None: it may)."""
    if other.kind != failed.kind:
        return "other-kind"
    if other.served_model_name != failed.served_model_name:
        return "other-weights"
    return None
