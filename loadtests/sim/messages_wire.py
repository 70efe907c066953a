"""vLLM 0.28's Anthropic Messages bytes, built from the engine's output (sans-io).

vLLM serves `/v1/messages` by turning the request into a chat request (with continuous usage
when streaming) and translating the chat stream's chunks into Anthropic events
(`message_stream_converter`), or the chat body into a message (`messages_full_converter`). This
module writes what that translation yields for text answers (tools and reasoning are not
simulated): `event: <type>\\ndata: <json>\\n\\n` frames, `type` first and `index` after
`delta`/`content_block`, no `ping`, no `[DONE]`. Checked byte for byte against the 0.28.0
`anth_*` golden fixtures (tests/sim/test_golden_messages.py).
"""

from __future__ import annotations

import orjson

from proxy.vllm_wire import EVENT, FRAME_END, Json

# 0.28 maps the chat finish reason; a matched stop string is reported as `end_turn`, and no
# `stop_sequence` is sent.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

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
    """`translate_error_response`: 0.28 passes vLLM's internal error type name."""
    return {"type": "error", "error": {"type": err_type, "message": message}}


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


def message(
    message_id: str,
    model: str,
    text: str,
    finish_reason: str,
    prompt_tokens: int,
    output_tokens: int,
    cached: int | None,
) -> Json:
    """A full (non-streaming) message: `model_dump(exclude_none=True)`, no `stop_sequence`."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}] if text else [],
        "model": model,
        "stop_reason": STOP_REASONS.get(finish_reason, "end_turn"),
        "usage": usage(prompt_tokens, output_tokens, cached),
    }


class MessagesStream:
    """The events of one streamed message, fed the engine's deltas as the chat layer sees them."""

    def __init__(
        self, *, message_id: str, model: str, prompt_tokens: int, cached: int | None = None
    ) -> None:
        self.message_id, self.model = message_id, model
        self.prompt_tokens, self.cached = prompt_tokens, cached
        self.block_open = False
        self.finish_reason: str | None = None
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

    def delta(self, text: str, finish_reason: str | None) -> list[bytes]:
        """One engine output's events. An `error` finish ends the stream here: 0.28 leaves the
        text block open and sends neither `message_delta` nor `message_stop`."""
        if finish_reason == "error":
            self.failed = True
            error = anthropic_error("internal_error", MIDSTREAM_ERROR)
            return [event("error", error)]
        out: list[bytes] = []
        if text:
            if not self.block_open:
                out.append(
                    event(
                        "content_block_start",
                        {
                            "type": "content_block_start",
                            "content_block": {"type": "text", "text": ""},
                            "index": 0,
                        },
                    )
                )
                self.block_open = True
            out.append(
                event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "delta": {"type": "text_delta", "text": text},
                        "index": 0,
                    },
                )
            )
        if finish_reason is not None:
            self.finish_reason = finish_reason
        return out

    def end(self, output_tokens: int) -> list[bytes]:
        """From the final usage chunk and `[DONE]`: close the block, `message_delta`, stop."""
        out: list[bytes] = []
        if self.block_open:
            out.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}))
            self.block_open = False
        reason = STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        out.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": reason},
                    "usage": usage(self.prompt_tokens, output_tokens, self.cached),
                },
            )
        )
        out.append(event("message_stop", {"type": "message_stop"}))
        return out
