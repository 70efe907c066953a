"""Tools and reasoning for one request: vLLM's tool_choice check, the scripted turn, the parsers.

What the server's flags and the request together decide, as in vLLM 0.28.0's serving code:
* `tools` with `tool_choice` "auto" (the default when tools are present) need
  `--enable-auto-tool-choice` and `--tool-call-parser`, otherwise a 400; "none", "required" and
  a named function are served without them;
* the tool parser runs only for "auto" with tools; "none" skips it;
* the reasoning parser runs whenever the server has one; the model thinks unless the request
  switches it off (chat: `chat_template_kwargs.enable_thinking: false`; Responses: thinking only
  when `reasoning` is sent, with an effort other than "none").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from proxy import vllm_wire

from . import scripted, toolparse
from .dialect import dialect
from .protocol import ChatMessage, ChatRequest, RequestError, ResponsesRequest
from .scripted import Tool, Turn
from .sequences import Script
from .state import SimConfig

AUTO_TOOL_CHOICE_ERROR = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


@dataclass(frozen=True, slots=True)
class Plan:
    """What one request will generate and how its output is parsed."""

    turn: Turn | None  # None: plain free text, no parsers
    script: Script | None
    reasoning: bool  # the reasoning parser runs
    tool_parser: str | None  # the tool parser that runs (None: not for this request)
    schemas: dict[str, dict[str, Any]]
    named: bool  # a named tool_choice: finish_reason stays "stop"
    keep_newlines: bool = False  # 0.33: see ChatParser
    implicit_think: bool = False  # 0.32: see ChatParser

    def parser(self) -> toolparse.ChatParser:
        return toolparse.ChatParser(
            reasoning=self.reasoning,
            tool_parser=self.tool_parser,
            tools=self.schemas,
            keep_newlines=self.keep_newlines,
            implicit_think=self.implicit_think,
        )

    def parse_full(self, text: str) -> tuple[str | None, str | None, list[dict[str, Any]]]:
        """content, reasoning and tool calls of a whole output (toolparse.parse_full)."""
        return toolparse.parse_full(
            text,
            reasoning=self.reasoning,
            tool_parser=self.tool_parser,
            tools=self.schemas,
            implicit_think=self.implicit_think,
        )

    @property
    def parses(self) -> bool:
        return self.reasoning or self.tool_parser is not None


def check_tool_choice(config: SimConfig, tools: list[Tool], tool_choice: Any) -> None:
    auto = tool_choice in (None, "auto")
    if tools and auto and not (config.enable_auto_tool_choice and config.tool_call_parser):
        raise RequestError(
            400, vllm_wire.error_body(AUTO_TOOL_CHOICE_ERROR, "BadRequestError", 400)
        )


def _calls_made(messages: list[ChatMessage]) -> int:
    return sum(len(m.tool_calls or []) for m in messages if m.role == "assistant")


def _results(messages: list[ChatMessage]) -> list[str]:
    """The tool results' texts, in order (what the final answer reports)."""
    out: list[str] = []
    for m in messages:
        if m.role == "tool":
            parts = m.content if isinstance(m.content, list) else [{"text": m.content or ""}]
            out.append("".join(str(p.get("text") or "") for p in parts if isinstance(p, dict)))
    return out


def _may_spawn(messages: list[ChatMessage]) -> bool:
    """Not a scripted subagent's own conversation (scripted.in_subagent): it may call one."""
    texts: list[str] = []
    for m in messages:
        if m.role != "user":
            continue
        parts = m.content if isinstance(m.content, list) else [{"text": m.content or ""}]
        texts += [str(p.get("text") or "") for p in parts if isinstance(p, dict)]
    return not scripted.in_subagent(texts)


def _plan(
    config: SimConfig,
    tools: list[Tool],
    tool_choice: Any,
    calls_made: int,
    thinking: bool,
    template_thinks: bool = True,
    spawn: bool = True,
    results: list[str] | None = None,
) -> Plan:
    """`thinking`: the scripted turn thinks; `template_thinks`: the chat template's
    `enable_thinking` (what 0.32's parser starts from)."""
    check_tool_choice(config, tools, tool_choice)
    reasoning = config.reasoning_parser is not None
    thinking = thinking and reasoning
    offered = bool(tools) and tool_choice != "none"
    d = dialect(config.vllm_version)
    keep = d.reasoning_keeps_newlines
    implicit = d.implicit_think and reasoning and template_thinks
    if not offered and not thinking:
        return Plan(None, None, reasoning, None, {}, False, keep, implicit)
    turn = scripted.decide(
        tools, tool_choice, calls_made, thinking=thinking, subagent=spawn, results=results
    )
    # "required" and a named function are decoded without the auto parser; the simulator writes
    # their calls in the configured parser's markup (hermes without one) and parses them back.
    tool_parser = (config.tool_call_parser or "hermes") if offered else None
    text = toolparse.render(turn, tool_parser)
    complete = bool(turn.calls) or turn.content is not None
    script = Script(tuple(toolparse.pieces(text)), complete)
    schemas = {t.name: t.parameters for t in tools}
    named = isinstance(tool_choice, dict)
    return Plan(turn, script, reasoning, tool_parser, schemas, named, keep, implicit)


def chat_plan(config: SimConfig, req: ChatRequest) -> Plan:
    tools = scripted.chat_tools(req.tools)
    kwargs = req.chat_template_kwargs or {}
    thinking = kwargs.get("enable_thinking", True) is not False
    made, spawn = _calls_made(req.messages), _may_spawn(req.messages)
    results = _results(req.messages)
    return _plan(config, tools, req.tool_choice, made, thinking, thinking, spawn, results)


def responses_plan(config: SimConfig, req: ResponsesRequest, messages: list[ChatMessage]) -> Plan:
    tools = scripted.responses_tools(req.tools)
    effort = (req.reasoning or {}).get("effort")
    thinking = req.reasoning is not None and effort != "none"
    made, spawn = _calls_made(messages), _may_spawn(messages)
    return _plan(
        config, tools, req.tool_choice, made, thinking, spawn=spawn, results=_results(messages)
    )
