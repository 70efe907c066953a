"""SGLang 0.5.23's Anthropic Messages and Responses bytes, for the simulator's SGLang mode: text
answers as its `AnthropicServing` (over its chat serving, one `content_block_delta` per engine
output) and its `OpenAIServingResponses` (the non-harmony path, one `response.output_text.delta`
per engine output) write them. Sans-io; the frozen fixtures (tests/fixtures/sglang-golden/0.5.23,
`messages_*`, `responses_*`) are the check.

Where they differ from vLLM's (messages_wire.py, responses_wire.py): Messages has no
`stop_sequence` key and its `message_start` carries the prompt's tokens; Responses events number
from 0, put `type` last on item events and first on lifecycle ones, end without `[DONE]`, and a
`max_tokens` cut ends with `response.incomplete`. Tools, reasoning and stored responses are not
imitated.
"""

from __future__ import annotations

from typing import Any

import orjson

Json = dict[str, Any]
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def event(kind: str, obj: Json) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


# Anthropic Messages


def message_body(
    message_id: str, model: str, text: str, finish: str | None, prompt: int, output: int
) -> Json:
    """`_convert_response`'s message, `model_dump(exclude_none=True)`."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "model": model,
        "stop_reason": STOP_REASONS.get(finish or "", "end_turn"),
        "usage": {"input_tokens": prompt, "output_tokens": output},
    }


class MessagesStream:
    """`_generate_anthropic_stream`'s events for a text answer: `start` with the first engine
    output, `delta` per output, `end` after the last."""

    __slots__ = ("message_id", "model", "prompt", "opened")

    def __init__(self, message_id: str, model: str, prompt: int) -> None:
        self.message_id, self.model, self.prompt = message_id, model, prompt
        self.opened = False

    def delta(self, text: str) -> list[bytes]:
        out = [] if self.opened else self._start()
        self.opened = True
        if text:
            block = {"type": "content_block_delta", "index": 0}
            out.append(event("content_block_delta", {**block, "delta": _text_delta(text)}))
        return out

    def _start(self) -> list[bytes]:
        message = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "usage": {"input_tokens": self.prompt, "output_tokens": 0},
        }
        block = {"type": "content_block_start", "index": 0, "content_block": _TEXT_BLOCK}
        return [
            event("message_start", {"type": "message_start", "message": message}),
            event("content_block_start", block),
        ]

    def end(self, finish: str | None, output: int) -> list[bytes]:
        out = [] if self.opened else self._start()
        stop = STOP_REASONS.get(finish or "", "end_turn")
        delta = {"type": "message_delta", "delta": {"stop_reason": stop}}
        return [
            *out,
            event("content_block_stop", {"type": "content_block_stop", "index": 0}),
            event("message_delta", {**delta, "usage": {"output_tokens": output}}),
            event("message_stop", {"type": "message_stop"}),
        ]


_TEXT_BLOCK: Json = {"type": "text", "text": ""}
_TEXT_DONE = "response.output_text.done"


def _text_delta(text: str) -> Json:
    return {"type": "text_delta", "text": text}


# Responses


def response(
    request: Json,
    response_id: str,
    created: int,
    model: str,
    output: list[Json],
    usage: Json | None,
    status: str,
) -> Json:
    """`ResponsesResponse.from_request`, as its events and body write it."""
    temperature = request.get("temperature")
    top_p = request.get("top_p")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "output": output,
        "status": status,
        "usage": usage,
        "parallel_tool_calls": request.get("parallel_tool_calls", True) is not False,
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": [],
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "previous_response_id": request.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": request.get("store", True),
        "temperature": None if temperature is None else float(temperature),
        "text": {"format": {"type": "text"}} if output else None,
        "top_p": None if top_p is None else float(top_p),
        "truncation": request.get("truncation", "disabled"),
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def responses_usage(prompt: int, output: int) -> Json:
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + output,
    }


def status_of(finish: str | None) -> str:
    return "incomplete" if finish == "length" else "completed"


def _part(text: str) -> Json:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


def message_item(item_id: str, text: str | None) -> Json:
    """The answer's message item: open (`text` None) or done."""
    return {
        "id": item_id,
        "content": [] if text is None else [_part(text)],
        "role": "assistant",
        "status": "in_progress" if text is None else "completed",
        "type": "message",
        "phase": "final_answer",
    }


def responses_body(
    request: Json, response_id: str, item_id: str, created: int, model: str, text: str, **end: Any
) -> Json:
    """The whole response: `finish`, `prompt` and `output` (tokens) in `end`."""
    usage = responses_usage(end["prompt"], end["output"])
    output = [message_item(item_id, text)]
    return response(request, response_id, created, model, output, usage, status_of(end["finish"]))


class ResponsesStream:
    """`responses_stream_generator_non_harmony`'s events for a text answer."""

    __slots__ = ("request", "response_id", "item_id", "created", "model", "seq", "text")

    def __init__(
        self, request: Json, response_id: str, item_id: str, created: int, model: str
    ) -> None:
        self.request, self.response_id, self.item_id = request, response_id, item_id
        self.created, self.model = created, model
        self.seq = -1
        self.text = ""

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _lifecycle(self, kind: str, resp: Json) -> bytes:
        return event(kind, {"type": kind, "response": resp, "sequence_number": self._next()})

    def _item_event(self, kind: str, fields: Json) -> bytes:
        return event(kind, {**fields, "sequence_number": self._next(), "type": kind})

    def start(self) -> list[bytes]:
        begun = response(
            self.request, self.response_id, self.created, self.model, [], None, "in_progress"
        )
        return [
            self._lifecycle("response.created", begun),
            self._lifecycle("response.in_progress", begun),
            self._item_event(
                "response.output_item.added",
                {"item": message_item(self.item_id, None), "output_index": 0},
            ),
            self._item_event(
                "response.content_part.added",
                {**self._where(), "part": _part("")},
            ),
        ]

    def _where(self) -> Json:
        return {"content_index": 0, "item_id": self.item_id, "output_index": 0}

    def delta(self, text: str) -> list[bytes]:
        if not text:
            return []
        self.text += text
        fields = {"content_index": 0, "delta": text, "item_id": self.item_id, "logprobs": []}
        return [self._item_event("response.output_text.delta", {**fields, "output_index": 0})]

    def end(self, finish: str | None, prompt: int, output: int) -> list[bytes]:
        w, text = self._where(), self.text
        done = {"content_index": 0, "item_id": self.item_id, "logprobs": [], "output_index": 0}
        final = responses_body(
            self.request,
            self.response_id,
            self.item_id,
            self.created,
            self.model,
            text,
            finish=finish,
            prompt=prompt,
            output=output,
        )
        last = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return [
            event(
                "response.output_text.done",
                {**done, "sequence_number": self._next(), "text": text, "type": _TEXT_DONE},
            ),
            self._item_event("response.content_part.done", {**w, "part": _part(text)}),
            self._item_event(
                "response.output_item.done",
                {"item": message_item(self.item_id, text), "output_index": 0},
            ),
            self._lifecycle(last, final),
        ]
