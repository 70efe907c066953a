"""`/v1/responses` objects and stream events, as vLLM's `OpenAIServingResponses` writes them."""

from __future__ import annotations

from proxy.vllm_wire import Json, sse_event


class ResponsesEvents:
    """`/v1/responses` objects and stream events (openai-python event types, sequence numbers)."""

    def __init__(
        self,
        *,
        response_id: str,
        item_id: str,
        created: int,
        model: str,
        temperature: float,
        max_output_tokens: int | None,
        instructions: str | None,
        tools: list[Json] | None = None,
        tool_choice: str | Json | None = None,
        reasoning: Json | None = None,
    ) -> None:
        self.echo = {
            "tools": tools or [],
            "tool_choice": tool_choice or "auto",
            "reasoning": reasoning,
        }
        self.response_id = response_id
        self.item_id = item_id
        self.created = created
        self.model = model
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.instructions = instructions
        self.seq = 0

    def response(
        self, status: str, output: list[Json], usage_obj: Json | None, incomplete: bool = False
    ) -> Json:
        return {
            "id": self.response_id,
            "created_at": self.created,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
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
            "reasoning": self.echo["reasoning"],
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": usage_obj,
            "user": None,
        }

    def message(self, text: str | None, status: str) -> Json:
        content = [] if text is None else [self.part(text)]
        return {
            "id": self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
        }

    @staticmethod
    def part(text: str) -> Json:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": []}

    @staticmethod
    def usage(prompt_tokens: int, output_tokens: int, cached: int, reasoning: int = 0) -> Json:
        return {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt_tokens + output_tokens,
        }

    def event(self, event_type: str, fields: Json) -> bytes:
        obj = {**fields, "sequence_number": self.seq, "type": event_type}
        self.seq += 1
        return sse_event(event_type, obj)

    def text_delta(self, delta: str) -> bytes:
        return self.event(
            "response.output_text.delta",
            {
                "content_index": 0,
                "delta": delta,
                "item_id": self.item_id,
                "logprobs": [],
                "output_index": 0,
            },
        )
