"""vLLM's Anthropic Messages bytes (0.28 and 0.33), built from the engine's output (sans-io).

vLLM serves `/v1/messages` by turning the request into a chat request (with continuous usage
when streaming) and translating the chat stream's chunks into Anthropic events
(`message_stream_converter`), or the chat body into a message (`messages_full_converter`). This
module writes what that translation yields, fed the chat layer's deltas (toolparse.ChatParser:
text, reasoning, tool calls): `event: <type>\\ndata: <json>\\n\\n` frames, `type` first and
`index` after `delta`/`content_block`, no `ping`, no `[DONE]`. What 0.33 changed (stop
sequences, error type names, the mid-stream error) follows the Dialect. Checked byte for byte
against the `anth_*` golden fixtures (tests/sim/test_golden_messages.py, tests/sim/test_golden.py).
"""

from __future__ import annotations

import json
import uuid

import orjson

from proxy.vllm_wire import ANTHROPIC_ERROR_TYPES, EVENT, FRAME_END, Json

from .dialect import Dialect, dialect

# The chat finish reason, mapped; 0.28 reports a matched stop string as `end_turn` too.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
V028 = dialect("0.28.0")

# 0.28's converter cannot parse the chat layer's mid-stream error frame and reports pydantic's
# complaint about it instead (the chat error's message is always vLLM's "Internal server error").
_MIDSTREAM_INPUT = "{'error': {'message': 'In...am': None, 'code': 500}}"
_MIDSTREAM_FIELD = (
    "  Field required [type=missing, input_value=" + _MIDSTREAM_INPUT + ", input_type=dict]\n"
    "    For further information visit https://errors.pydantic.dev/2.14/v/missing"
)
MIDSTREAM_ERROR = (
    "2 validation errors for ChatCompletionStreamResponse\n"
    f"model\n{_MIDSTREAM_FIELD}\nchoices\n{_MIDSTREAM_FIELD}"
)


def event(kind: str, obj: Json) -> bytes:
    return EVENT + kind.encode() + b"\n" + b"data: " + orjson.dumps(obj) + FRAME_END


def anthropic_error(err_type: str, message: str) -> Json:
    """`translate_error_response`'s body."""
    return {"type": "error", "error": {"type": err_type, "message": message}}


def error_type(d: Dialect, status: int, internal: str) -> str:
    """0.28 passes vLLM's internal error type name (`NotFoundError`), 0.33 maps the status."""
    if not d.anthropic_error_types:
        return internal
    return ANTHROPIC_ERROR_TYPES.get(status, "api_error")


def stop(d: Dialect, finish_reason: str | None, stop_reason: object) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): 0.33 reports a matched stop string as `stop_sequence`."""
    if d.anthropic_stop_sequence and finish_reason == "stop" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason
    return STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def usage(prompt_tokens: int, output_tokens: int, cached: int | None) -> Json:
    """The final usage; `cached` is None unless `--enable-prompt-tokens-details` (then the
    cached tokens are reported apart, and `input_tokens` counts only the others)."""
    if cached is None:
        return {"input_tokens": prompt_tokens, "output_tokens": output_tokens}
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def signature() -> str:
    """A thinking block's signature: a fresh uuid4 hex, not a real signature (vLLM ignores it
    when a client sends it back)."""
    return uuid.uuid4().hex


def content_blocks(content: str | None, reasoning: str | None, calls: list[Json]) -> list[Json]:
    """`messages_full_converter`'s blocks: thinking, then text, then one tool_use per call."""
    blocks: list[Json] = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": signature()})
    if content:
        blocks.append({"type": "text", "text": content})
    for call in calls:
        fn = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call["id"],
                "name": fn["name"],
                "input": json.loads(fn["arguments"] or "{}"),
            }
        )
    return blocks


def message(
    message_id: str,
    model: str,
    text: str | None,
    finish_reason: str | None,
    prompt_tokens: int,
    output_tokens: int,
    cached: int | None,
    *,
    reasoning: str | None = None,
    calls: list[Json] | None = None,
    stop_reason: object = None,
    d: Dialect = V028,
) -> Json:
    """A full (non-streaming) message: `model_dump(exclude_none=True)`, so `stop_sequence` only
    when one matched (0.33)."""
    reason, sequence = stop(d, finish_reason, stop_reason)
    body: Json = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content_blocks(text, reasoning, calls or []),
        "model": model,
        "stop_reason": reason,
    }
    if sequence is not None:
        body["stop_sequence"] = sequence
    body["usage"] = usage(prompt_tokens, output_tokens, cached)
    return body


def _block_event(kind: str, index: int, **fields: Json) -> bytes:
    return event(kind, {"type": kind, **fields, "index": index})


class MessagesStream:
    """The events of one streamed message, fed the chat layer's deltas (`DeltaMessage` dicts).

    One block is open at a time: a thinking, text or tool_use block; a delta of another kind
    closes it (a thinking block with its signature first) and opens the next, at the next index.
    Text arriving while a tool_use block is open is held back and sent as its own text block
    once that block closes, so a call's input is never split.
    """

    def __init__(
        self,
        *,
        message_id: str,
        model: str,
        prompt_tokens: int,
        cached: int | None = None,
        d: Dialect = V028,
    ) -> None:
        self.d = d
        self.message_id, self.model = message_id, model
        self.prompt_tokens, self.cached = prompt_tokens, cached
        self.kind: str | None = None  # the open block's type
        self.index = 0  # the open block's index, or the next block's when none is open
        self.tool_id: str | None = None
        self.tool_ids: dict[int, str] = {}  # chat tool-call index -> tool_use id
        self.pending: list[str] = []  # text held back while a tool_use block is open
        self.finish_reason: str | None = None
        self.stop_reason: object = None  # the matched stop string, if one was
        self.failed = False

    def start(self) -> bytes:
        """`message_start`, from the chat stream's role chunk (its usage: the whole prompt)."""
        return event(
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": self.message_id,
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": self.model,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
                },
            },
        )

    @property
    def block_open(self) -> bool:
        return self.kind is not None

    def delta(
        self, text: str, finish_reason: str | None, stop_reason: object = None
    ) -> list[bytes]:
        """A plain text step (no parsers): the chat layer's `{"content": text}`."""
        return self.chat_delta({"content": text}, finish_reason, stop_reason)

    def chat_delta(
        self, delta: Json | None, finish_reason: str | None, stop_reason: object = None
    ) -> list[bytes]:
        """One chat chunk's events. An `error` finish ends the stream here, with neither
        `message_delta` nor `message_stop`: 0.28 leaves the open block open, 0.33 closes it."""
        if finish_reason == "error":
            self.failed = True
            if not self.d.anthropic_error_types:
                return [event("error", anthropic_error("internal_error", MIDSTREAM_ERROR))]
            error = anthropic_error("api_error", "Internal server error")
            return [*self._close(), event("error", error)]
        if finish_reason is not None:
            self.finish_reason, self.stop_reason = finish_reason, stop_reason
        if not delta:
            return []
        out: list[bytes] = []
        if delta.get("reasoning"):
            out += self._text_like("thinking", str(delta["reasoning"]))
        if delta.get("content"):
            if self.kind == "tool_use":
                self.pending.append(str(delta["content"]))
            else:
                out += self._text_like("text", str(delta["content"]))
        for call in delta.get("tool_calls") or []:
            out += self._tool(call)
        return out

    def _text_like(self, kind: str, text: str) -> list[bytes]:
        out: list[bytes] = []
        if self.kind != kind:
            out += self._close()
            out.append(
                _block_event(
                    "content_block_start", self.index, content_block={"type": kind, kind: ""}
                )
            )
            self.kind = kind
        field = "thinking_delta" if kind == "thinking" else "text_delta"
        out.append(
            _block_event("content_block_delta", self.index, delta={"type": field, kind: text})
        )
        return out

    def _tool(self, call: Json) -> list[bytes]:
        fn = call.get("function") or {}
        out: list[bytes] = []
        if call.get("id") is not None:
            self.tool_ids[call["index"]] = call["id"]
            if self.tool_id != call["id"] and fn.get("name") is not None:
                out += self._close()
                out.append(
                    _block_event(
                        "content_block_start",
                        self.index,
                        content_block={
                            "type": "tool_use",
                            "id": call["id"],
                            "name": fn["name"],
                            "input": {},
                        },
                    )
                )
                self.kind, self.tool_id = "tool_use", call["id"]
            tool_id: str | None = call["id"]
        else:
            tool_id = self.tool_ids.get(call.get("index", -1))
        if fn.get("arguments") and tool_id is not None and tool_id == self.tool_id:
            out.append(
                _block_event(
                    "content_block_delta",
                    self.index,
                    delta={"type": "input_json_delta", "partial_json": fn["arguments"]},
                )
            )
        return out

    def _close(self) -> list[bytes]:
        """Close the open block (a thinking block gets its signature first); after a tool_use
        block, the text held back meanwhile opens a text block."""
        if self.kind is None:
            return []
        out: list[bytes] = []
        if self.kind == "thinking":
            out.append(
                _block_event(
                    "content_block_delta",
                    self.index,
                    delta={"type": "signature_delta", "signature": signature()},
                )
            )
        out.append(_block_event("content_block_stop", self.index))
        was_tool = self.kind == "tool_use"
        self.kind, self.tool_id = None, None
        self.index += 1
        if was_tool and self.pending:
            text, self.pending = "".join(self.pending), []
            out += self._text_like("text", text)
        return out

    def end(self, output_tokens: int) -> list[bytes]:
        """From the final usage chunk and `[DONE]`: close the block(s), `message_delta`, stop."""
        out = self._close()
        out += self._close()  # the text block a closing tool_use block may have opened
        reason, sequence = stop(self.d, self.finish_reason, self.stop_reason)
        delta: Json = {"stop_reason": reason}
        if self.d.anthropic_stop_sequence:
            delta["stop_sequence"] = sequence
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": delta,
                    "usage": usage(self.prompt_tokens, output_tokens, self.cached),
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return out
