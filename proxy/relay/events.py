"""Readers for typed event streams (`event: <type>` then `data: <json>`): /v1/responses and
Anthropic /v1/messages. Sans-io, like proxy/relay/measure.py's StreamFilter, which hands them
every frame it does not interpret itself; they only read (the bytes go to the client untouched).

vLLM sends no per-event usage on these APIs: a reader takes the time of every event that
carries generated text, reasoning or tool-call arguments (`Measurement.record_delta`) and the
token counts from the final event, so ITL and tokens per step are request averages ("average");
withheld once a tool call streams (its parser buffers tokens, so events are not steps).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from proxy.record.measure import Measurement
from proxy.relay.measure import EventReader
from proxy.vllm_wire import EVENT

_DATA = b"\ndata: "


def event_type(frame: bytes) -> bytes:
    """The frame's `event:` type (b"" without one)."""
    if not frame.startswith(EVENT):
        return b""
    end = frame.find(b"\n")
    return frame[len(EVENT) : end if end >= 0 else len(frame)].rstrip(b"\r")


def event_data(frame: bytes) -> dict[str, Any] | None:
    """The frame's `data:` object, when it is one."""
    start = frame.find(_DATA)
    if start < 0:
        return None
    try:
        obj = orjson.loads(frame[start + len(_DATA) :].strip())
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class ResponsesReader:
    """/v1/responses: token deltas, then `response.completed` (`response.incomplete` on vLLM
    0.33 when cut by max_output_tokens, `response.failed`) with the usage and the status."""

    __slots__ = ("m",)
    TOKENS = frozenset(
        (
            b"response.output_text.delta",
            b"response.reasoning_text.delta",
            b"response.reasoning_summary_text.delta",
            b"response.function_call_arguments.delta",
            b"response.refusal.delta",
            b"response.custom_tool_call_input.delta",
            b"response.mcp_call_arguments.delta",
            b"response.code_interpreter_call_code.delta",
        )
    )
    FINAL = frozenset((b"response.completed", b"response.incomplete", b"response.failed"))

    def __init__(self, m: Measurement) -> None:
        self.m = m

    # A tool-call parser buffers the call's tokens: its events are not one per step.
    TOOL_CALLS = frozenset(
        (
            b"response.function_call_arguments.delta",
            b"response.custom_tool_call_input.delta",
            b"response.mcp_call_arguments.delta",
        )
    )

    def read(self, frame: bytes, now: float) -> None:
        kind = event_type(frame)
        if kind in self.TOKENS:
            self.m.record_delta(now)
            if kind in self.TOOL_CALLS:
                self.m.estimate_void = self.m.estimate_void or "tool_calls"
        elif kind in self.FINAL:
            obj = event_data(frame)
            resp = obj.get("response") if obj is not None else None
            if isinstance(resp, dict):
                self.final(resp)
        elif kind == b"error":
            obj = event_data(frame)
            err = obj.get("error") if obj is not None else None
            self.m.error = str(
                err.get("message")
                if isinstance(err, dict)
                else (obj or {}).get("message", "error event")
            )

    def final(self, resp: dict[str, Any]) -> None:
        """The final response object (also a non-streaming body)."""
        m = self.m
        if isinstance(resp.get("id"), str):
            m.response_id = resp["id"]
        usage = resp.get("usage")
        if isinstance(usage, dict):
            m.record_usage(usage)
        details = resp.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        status = resp.get("status")
        m.finish_reason = (
            reason if isinstance(reason, str) else status if isinstance(status, str) else None
        )
        err = resp.get("error")
        if status == "failed":
            m.error = str(err.get("message") if isinstance(err, dict) else "response failed")


class MessagesReader:
    """Anthropic /v1/messages: `message_start` (input tokens), `content_block_delta` events
    (text, thinking, tool input JSON; a thinking block's signature is not generated text),
    `message_delta` (the final usage and stop reason), `error`."""

    __slots__ = ("m",)
    TOKENS = (b'"type":"text_delta"', b'"type":"thinking_delta"', b'"type":"input_json_delta"')
    TOOL_CALL = TOKENS[2]

    def __init__(self, m: Measurement) -> None:
        self.m = m

    def read(self, frame: bytes, now: float) -> None:
        kind = event_type(frame)
        if kind == b"content_block_delta":
            if any(t in frame for t in self.TOKENS):
                self.m.record_delta(now)
            if self.TOOL_CALL in frame:  # a tool-call parser buffers the call's tokens
                self.m.estimate_void = self.m.estimate_void or "tool_calls"
        elif kind == b"message_start":
            obj = event_data(frame)
            msg = obj.get("message") if obj is not None else None
            if isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
                self.m.record_usage(msg["usage"])
        elif kind == b"message_delta":
            obj = event_data(frame) or {}
            if isinstance(obj.get("usage"), dict):
                self.m.record_usage(obj["usage"])
            delta = obj.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str):
                self.m.finish_reason = reason
        elif kind == b"error":
            obj = event_data(frame) or {}
            err = obj.get("error")
            self.m.error = str(err.get("message") if isinstance(err, dict) else "error event")


# By the API's name (the `Endpoint` of proxy/relay/forward.py): the reader of its event stream.
READERS: dict[str, Callable[[Measurement], EventReader]] = {
    "responses": ResponsesReader,
    "messages": MessagesReader,
}


def reader_for(endpoint: str, m: Measurement) -> EventReader | None:
    make = READERS.get(endpoint)
    return None if make is None else make(m)
