"""`/v1/responses` objects and stream events, as vLLM's `OpenAIServingResponses` writes them.

Shapes follow the golden fixtures (shared/reference/vllm-golden/<version>/responses_*), byte for
byte; what differs between 0.28.0 and 0.33.0 is read from the release's `Dialect`.
"""

from __future__ import annotations

import secrets

from proxy.vllm_wire import Json, sse_event

from .dialect import Dialect


def _hex() -> str:
    return secrets.token_hex(8)


class ResponsesEvents:
    """`/v1/responses` objects and stream events (openai-python event types, sequence numbers)."""

    def __init__(
        self,
        *,
        dialect: Dialect,
        response_id: str,
        created: int,
        model: str,
        temperature: float,
        max_output_tokens: int,
        instructions: str | None,
        tools: list[Json] | None = None,
        tool_choice: str | Json | None = None,
        reasoning: Json | None = None,
    ) -> None:
        # vLLM echoes the request's tool_choice; unset, it is "none" without tools (fixtures)
        # and "auto" with them (as chat, whose default turns "auto" when tools are given).
        if tool_choice is None:
            tool_choice = "auto" if tools else "none"
        self.echo = {"tools": tools or [], "tool_choice": tool_choice, "reasoning": reasoning}
        self.dialect = dialect
        self.response_id = response_id
        self.item_id = self.stream_item_id()
        self.created = created
        self.model = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens  # the resolved limit (SamplingParams)
        self.instructions = instructions
        self.seq = 0

    # -- ids and statuses -----------------------------------------------------------------

    def stream_item_id(self) -> str:
        """Id of a message item opened in a stream: a bare 16-hex id in 0.28, `msg_…` in 0.33."""
        return f"msg_{_hex()}" if self.dialect.responses_stable_message_id else _hex()

    def final_item_id(self, streamed: str) -> str:
        """The id the finished response gives that message: 0.28 builds a fresh `msg_…` one."""
        return streamed if self.dialect.responses_stable_message_id else f"msg_{_hex()}"

    def item_status(self, truncated: bool) -> str:
        """A message cut by max_output_tokens is "incomplete" in 0.33, "completed" in 0.28."""
        return (
            "incomplete" if truncated and self.dialect.responses_incomplete_event else "completed"
        )

    def final_event(self, status: str) -> str:
        """0.33 ends a truncated stream with `response.incomplete`, 0.28 with `.completed`."""
        if status == "incomplete" and self.dialect.responses_incomplete_event:
            return "response.incomplete"
        return "response.completed"

    # -- objects --------------------------------------------------------------------------

    def response(self, status: str, output: list[Json], usage_obj: Json | None) -> Json:
        new = self.dialect.responses_prompt_cache
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.response_id,
            "created_at": self.created,
            "incomplete_details": incomplete,
            "instructions": self.instructions,
            "metadata": None,
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": True,
            "temperature": self.temperature,
            "tool_choice": self.echo["tool_choice"],
            "tools": self.echo["tools"],
            "top_p": 1.0,
            "background": False,
            "max_output_tokens": self.max_output_tokens,
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            **(
                {
                    "prompt_cache_options": None,
                    "prompt_cache_key": None,
                    "prompt_cache_retention": None,
                }
                if new
                else {}
            ),
            "reasoning": self.echo["reasoning"],
            **({"safety_identifier": None} if new else {}),
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage_obj,
            "user": None,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }

    def message(self, text: str | None, status: str, item_id: str | None = None) -> Json:
        """A message item; its text part is a finished one (`logprobs: null`)."""
        content = [] if text is None else [self.part(text, done=True)]
        return {
            "id": item_id or self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
            "phase": None,
        }

    def message_done(self, text: str, status: str, item_id: str | None = None) -> Json:
        """The item of `response.output_item.done` (0.28 adds `"summary":[]` to it)."""
        item = self.message(text, status, item_id)
        return item if self.dialect.responses_stable_message_id else {**item, "summary": []}

    @staticmethod
    def part(text: str, done: bool = False) -> Json:
        """An output_text part: `logprobs` is `[]` while streaming, `null` once done."""
        logprobs: list[Json] | None = None if done else []
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}

    def usage(
        self, prompt_tokens: int, output_tokens: int, cached: int, reasoning: int = 0
    ) -> Json:
        write = {"cache_write_tokens": 0} if self.dialect.responses_cache_write else {}
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {
                "cached_tokens": cached,
                **write,
                "input_tokens_per_turn": [],
                "cached_tokens_per_turn": [],
            },
            "output_tokens": output_tokens,
            "output_tokens_details": {
                "reasoning_tokens": reasoning,
                "tool_output_tokens": 0,
                "output_tokens_per_turn": [],
                "tool_output_tokens_per_turn": [],
            },
            "total_tokens": prompt_tokens + output_tokens,
        }

    # -- events ---------------------------------------------------------------------------

    def event(self, event_type: str, fields: Json) -> bytes:
        # openai-python's event models declare their fields in alphabetical order (so
        # `sequence_number` comes before `text` in output_text.done, after `part` elsewhere).
        fields = {**fields, "sequence_number": self.seq, "type": event_type}
        obj = {key: fields[key] for key in sorted(fields)}
        self.seq += 1
        return sse_event(event_type, obj)

    def text_delta(self, delta: str, item_id: str | None = None, output_index: int = 0) -> bytes:
        return self.event(
            "response.output_text.delta",
            {
                "content_index": 0,
                "delta": delta,
                "item_id": item_id or self.item_id,
                "logprobs": [],
                "output_index": output_index,
            },
        )

    def text_done(self, text: str, item_id: str, output_index: int) -> list[bytes]:
        """output_text.done and content_part.done of a message item."""
        base = {"content_index": 0, "item_id": item_id}
        return [
            self.event(
                "response.output_text.done",
                {**base, "logprobs": [], "output_index": output_index, "text": text},
            ),
            self.event(
                "response.content_part.done",
                {**base, "output_index": output_index, "part": self.part(text, done=True)},
            ),
        ]
