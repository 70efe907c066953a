"""`/v1/responses` output built from the chat parser's deltas: reasoning, message, tool calls.

No golden fixture covers Responses with tools or reasoning; this follows vLLM 0.28.0's Responses
serving code for the simple (non-Harmony) path: a state machine over the chat `DeltaMessage`s
(tool call > reasoning > content; a change of kind, or of tool-call index, closes the open item
and opens the next). Items and events:
* reasoning: `output_item.added` (reasoning item), `reasoning_part.added`,
  `reasoning_text.delta`…, then `reasoning_text.done`, `reasoning_part.done`, `output_item.done`;
* message: `output_item.added`, `content_part.added`, `output_text.delta`…, then the three dones;
* function call: `output_item.added` (function_call, arguments ""), `function_call_arguments.delta`
  …, then `function_call_arguments.done` (with the name) and `output_item.done`.
Custom (freeform) tools, which vLLM 0.28.0 does not know, are answered the way OpenAI's API does:
a `custom_tool_call` item with `custom_tool_call_input.delta/done`, its input sent whole at the end.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from .responses_wire import ResponsesEvents

Json = dict[str, Any]


def _hex() -> str:
    return secrets.token_hex(8)


def reasoning_item(item_id: str, text: str | None, status: str | None) -> Json:
    content = None if text is None else [{"text": text, "type": "reasoning_text"}]
    return {
        "id": item_id,
        "summary": [],
        "type": "reasoning",
        "content": content,
        "encrypted_content": None,
        "status": status,
    }


def call_item(
    item_id: str, call_id: str, name: str, arguments: str, status: str, custom: bool
) -> Json:
    if custom:
        try:
            text = str(json.loads(arguments).get("input", "")) if arguments else ""
        except (ValueError, AttributeError):
            text = arguments
        return {
            "call_id": call_id,
            "input": text,
            "name": name,
            "type": "custom_tool_call",
            "id": item_id,
            "status": status,
        }
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": item_id,
        "status": status,
    }


class ResponsesItems:
    """Turns chat deltas into Responses events (streaming) and output items (both)."""

    def __init__(self, ev: ResponsesEvents, custom_tools: set[str]) -> None:
        self.ev = ev
        self.custom = custom_tools
        self.output: list[Json] = []
        self.kind = ""  # "", "content", "reasoning", "tool"
        self.item_id = ""
        self.text = ""
        self.call: Json = {}

    # -- streaming ------------------------------------------------------------------------

    def feed(self, delta: Json) -> list[bytes]:
        calls = delta.get("tool_calls") or []
        if calls and "function" in calls[0]:
            target = "tool"
        elif delta.get("reasoning") is not None:
            target = "reasoning"
        elif delta.get("content"):
            target = "content"
        else:
            return []
        out: list[bytes] = []
        switch = target != self.kind or (
            target == "tool" and calls[0].get("index") != self.call.get("index")
        )
        if switch:
            out += self.close()
            out += self._open(target, calls[0] if calls else {})
        if self.kind == "reasoning" and delta.get("content") is not None:
            out += self._delta(str(delta.get("reasoning") or ""))
            out += self.close()
            out += self._open("content", {})
            return out + self._delta(str(delta["content"]))
        if self.kind == "tool":
            args = calls[0].get("function", {}).get("arguments")
            return out + (self._delta(args) if args else [])
        return out + self._delta(str(delta.get(target) or ""))

    def _open(self, kind: str, call: Json) -> list[bytes]:
        ev = self.ev
        self.kind, self.text, self.item_id = kind, "", _hex()
        index = len(self.output)
        if kind == "tool":
            name = call.get("function", {}).get("name", "")
            self.call = {
                "index": call.get("index"),
                "name": name,
                "call_id": f"call_{_hex()}",
                "custom": name in self.custom,
            }
            item = call_item(
                self.item_id, self.call["call_id"], name, "", "in_progress", self.call["custom"]
            )
            return [ev.event("response.output_item.added", {"item": item, "output_index": index})]
        if kind == "reasoning":
            if ev.dialect.responses_reasoning_content_part:
                self.item_id = f"rs_{self.item_id}"
            item = reasoning_item(self.item_id, None, "in_progress")
            part: Json = {"text": "", "type": "reasoning_text"}
            added = f"response.{self._reasoning_part()}.added"
        else:
            self.item_id = ev.stream_item_id()
            item = ev.message(None, "in_progress", self.item_id)
            part = ev.part("")
            added = "response.content_part.added"
        return [
            ev.event("response.output_item.added", {"item": item, "output_index": index}),
            ev.event(
                added,
                {"content_index": 0, "item_id": self.item_id, "output_index": index, "part": part},
            ),
        ]

    def _reasoning_part(self) -> str:
        """The event family of a reasoning item's part (dialect.py)."""
        new = self.ev.dialect.responses_reasoning_content_part
        return "content_part" if new else "reasoning_part"

    def _delta(self, text: str) -> list[bytes]:
        self.text += text
        index = len(self.output)
        fields: Json = {"delta": text, "item_id": self.item_id, "output_index": index}
        if self.kind == "tool":
            if self.call["custom"]:
                return []  # the input goes out whole when the call closes
            return [self.ev.event("response.function_call_arguments.delta", fields)]
        if self.kind == "reasoning":
            return [self.ev.event("response.reasoning_text.delta", {"content_index": 0, **fields})]
        return [self.ev.text_delta(text, self.item_id, index)]

    def close(self, truncated: bool = False) -> list[bytes]:
        """Done events of the open item (none open: nothing); `truncated`: the answer was cut
        by max_output_tokens (a message item's status then follows the release)."""
        if not self.kind:
            return []
        ev, index, text, iid = self.ev, len(self.output), self.text, self.item_id
        out: list[bytes] = []
        if self.kind == "tool":
            item = call_item(
                iid, self.call["call_id"], self.call["name"], text, "completed", self.call["custom"]
            )
            if self.call["custom"]:
                for kind, key in (("delta", "delta"), ("done", "input")):
                    out.append(
                        ev.event(
                            f"response.custom_tool_call_input.{kind}",
                            {key: item["input"], "item_id": iid, "output_index": index},
                        )
                    )
            elif text:
                out.append(
                    ev.event(
                        "response.function_call_arguments.done",
                        {
                            "arguments": text,
                            "item_id": iid,
                            "name": self.call["name"],
                            "output_index": index,
                        },
                    )
                )
        elif self.kind == "reasoning":
            item = reasoning_item(iid, text, "completed")
            part = {"text": text, "type": "reasoning_text"}
            base = {"content_index": 0, "item_id": iid, "output_index": index}
            out.append(ev.event("response.reasoning_text.done", {**base, "text": text}))
            out.append(ev.event(f"response.{self._reasoning_part()}.done", {**base, "part": part}))
        else:
            status = ev.item_status(truncated)
            out += ev.text_done(text, iid, index)
            done = ev.message_done(text, status, iid)
            out.append(ev.event("response.output_item.done", {"item": done, "output_index": index}))
            self.output.append(ev.message(text, status, ev.final_item_id(iid)))
            self.kind = ""
            return out
        out.append(ev.event("response.output_item.done", {"item": item, "output_index": index}))
        self.output.append(item)
        self.kind = ""
        return out

    # -- non-streaming --------------------------------------------------------------------

    def full(
        self,
        content: str | None,
        reasoning: str | None,
        calls: list[Json],
        truncated: bool = False,
    ) -> list[Json]:
        """The output items of a finished answer."""
        items: list[Json] = []
        if reasoning is not None:
            items.append(reasoning_item(f"rs_{_hex()}", reasoning, None))
        if content and (content.strip() or not calls):
            status = self.ev.item_status(truncated)
            items.append(self.ev.message(content, status, f"msg_{_hex()}"))
        for c in calls:
            fn = c["function"]
            items.append(
                call_item(
                    f"fc_{_hex()}",
                    f"call_{_hex()}",
                    fn["name"],
                    fn["arguments"],
                    "completed",
                    fn["name"] in self.custom,
                )
            )
        return items
