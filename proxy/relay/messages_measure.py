"""What the gateway measures on an Anthropic Messages stream (`event: <type>` frames).

vLLM's Messages stream carries usage only twice: `message_start` (input tokens) and
`message_delta` (the final counts); there is no per-event usage to ask for, so the frames are
relayed untouched. Until the shared Messages event reader lands, this counts the minimum: the
first `content_block_delta` is the first token, the final usage gives the token counts. It is
picked by API kind (proxy/relay/forward.py `_FILTERS`), so swapping it is one line.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.relay.measure import StreamFilter

_EVENT = b"event: "
_DELTA = b"event: content_block_delta"
_DATA = b"\ndata: "
# Anthropic's stop reasons, as the chat finish reasons the request log speaks.
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length",
           "tool_use": "tool_calls"}


class MessagesFilter(StreamFilter):
    """Reads a Messages stream's frames; returns them as they are (only the model renamed)."""

    __slots__ = ()

    def frame(self, frame: bytes, now: float) -> bytes:
        if self.rename is not None:
            frame = frame.replace(self.rename[0], self.rename[1])
        if frame.startswith(_DELTA):
            self.m.chunks += 1
            if self.m.t_first_token is None:
                self.m.t_first_token = now
            self.m.t_last_token = now
        elif frame.startswith(_EVENT):
            self._other(frame)
        return frame

    def _other(self, frame: bytes) -> None:
        event = _payload(frame)
        if event is None:
            return
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message")
            if isinstance(message, dict) and isinstance(message.get("usage"), dict):
                self._usage(message["usage"])
        elif kind == "message_delta":
            delta = event.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str):
                self.m.finish_reason = _FINISH.get(reason, reason)
            if isinstance(event.get("usage"), dict):
                self._usage(event["usage"])
        elif kind == "error":
            error = event.get("error")
            self.m.error = str(error.get("message")) if isinstance(error, dict) else "error event"

    def _usage(self, usage: dict[str, Any]) -> None:
        m = self.m
        fresh, read = usage.get("input_tokens"), usage.get("cache_read_input_tokens")
        created = usage.get("cache_creation_input_tokens")
        if isinstance(fresh, int):
            # vLLM counts `input_tokens` without the cached and cache-created tokens.
            cached = read if isinstance(read, int) else 0
            m.prompt_tokens = fresh + cached + (created if isinstance(created, int) else 0)
            if isinstance(read, int):
                m.cached_tokens = read
        output = usage.get("output_tokens")
        if isinstance(output, int) and output > m.completion_tokens:
            m.completion_tokens = output


def _payload(frame: bytes) -> dict[str, Any] | None:
    start = frame.find(_DATA)
    if start < 0:
        return None
    try:
        obj = orjson.loads(frame[start + len(_DATA):].strip())
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None
