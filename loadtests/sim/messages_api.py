"""`/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API on the same engine,
as vLLM 0.28 and 0.33 serve it (a chat request underneath; bytes from messages_wire.py).

A body that does not validate gets vLLM's generic OpenAI-shaped 400 (the Anthropic handler never
sees it); errors the handler returns (unknown model, tools without a tool parser) are
Anthropic-shaped, with vLLM's internal type names in 0.28 and Anthropic's in 0.33.

With tools (and `--enable-auto-tool-choice --tool-call-parser`) or `--reasoning-parser`, the
request is converted to the chat request vLLM builds (tools, tool_choice, tool_use / tool_result
blocks), planned like a chat request (tooluse.chat_plan: the scripted calls, then a final answer)
and its output parsed into chat deltas (toolparse.ChatParser) that messages_wire translates.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import Response

from . import messages_wire as mw
from . import preamble, protocol, scripted, toolparse, tooluse
from .asgi import DropResponse, FrameSource, json_response
from .engine import EngineRequest, SamplingSpec
from .protocol import ChatMessage, ChatRequest, RequestError
from .sequences import Script
from .state import Sim


class _Message(protocol._Base):
    role: str
    content: str | list[dict[str, Any]]


class CountTokensRequest(protocol._Base):
    model: str
    messages: list[_Message]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension, passed to the chat


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    output_config: dict[str, Any] | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("max_tokens must be positive")
        return value


def _error(sim: Sim, status: int, internal: str, message: str) -> RequestError:
    """An error the Anthropic handler answers (in its shape; type names by version)."""
    return RequestError(
        status, mw.anthropic_error(mw.error_type(sim.dialect, status, internal), message)
    )


def _tool_result_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return "" if content is None else str(content)


def _turn(m: _Message) -> list[ChatMessage]:
    """One Anthropic message as chat messages: `tool_result` blocks of a user turn become `tool`
    messages (before the turn's own text), `tool_use` blocks the assistant's `tool_calls`;
    thinking blocks are not rendered (vLLM passes them as `reasoning`, the template drops them)."""
    if isinstance(m.content, str):
        return [ChatMessage(role=m.role, content=m.content)]
    out: list[ChatMessage] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for block in m.content:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(block)
        elif kind == "tool_use":
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {
                        "name": block.get("name") or "",
                        "arguments": json.dumps(block.get("input") or {}),
                    },
                }
            )
        elif kind == "tool_result" and m.role == "user":
            out.append(ChatMessage(role="tool", content=_tool_result_text(block.get("content"))))
        elif kind == "tool_result":
            text = _tool_result_text(block.get("content"))
            parts.append({"type": "text", "text": f"Tool result: {text}"})
    if parts or calls:
        out.append(ChatMessage(role=m.role, content=parts or None, tool_calls=calls or None))
    return out


def _chat_messages(req: CountTokensRequest) -> list[ChatMessage]:
    """The chat conversion: system text first (top-level, then inline), then the turns."""
    system: list[str] = []
    if isinstance(req.system, str):
        system.append(req.system)
    elif req.system:
        system += [str(b.get("text", "")) for b in req.system if b.get("type") == "text"]
    out: list[ChatMessage] = []
    for m in req.messages:
        if m.role == "system":
            system.append(protocol._content_text(m.content))
        else:
            out += _turn(m)
    if system:
        out.insert(0, ChatMessage(role="system", content="".join(system)))
    return out


def _tool_choice(req: CountTokensRequest) -> str | dict[str, Any] | None:
    """Anthropic's tool_choice in chat terms; vLLM sets "auto" whenever tools are given."""
    kind = (req.tool_choice or {}).get("type")
    if kind == "tool":
        return {"type": "function", "function": {"name": (req.tool_choice or {}).get("name")}}
    choice = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
    return choice or ("auto" if req.tools is not None else None)


def _chat_request(req: CountTokensRequest) -> ChatRequest:
    """The chat request vLLM builds from a Messages request (what the parsers and script see)."""
    tools = (
        None
        if req.tools is None
        else [
            {
                "type": "function",
                "function": {
                    "name": t.get("name"),
                    "description": t.get("description"),
                    "parameters": t.get("input_schema"),
                },
            }
            for t in req.tools
        ]
    )
    return ChatRequest(
        model=req.model,
        messages=_chat_messages(req),
        tools=tools,
        tool_choice=_tool_choice(req),
        chat_template_kwargs=req.chat_template_kwargs,
    )


def _structured(plan: tooluse.Plan, output_config: dict[str, Any] | None) -> tooluse.Plan:
    """`output_config.format` (vLLM turns it into a json_schema response_format): guided decoding
    makes the answer a JSON object of the schema, short and complete (Claude Code's session
    title asks for one), unless the turn calls a tool."""
    fmt = (output_config or {}).get("format") or {}
    schema = fmt.get("schema", fmt.get("json_schema")) if isinstance(fmt, dict) else None
    if not isinstance(schema, dict) or (plan.turn is not None and plan.turn.calls):
        return plan
    reasoning = plan.turn.reasoning if plan.turn is not None else None
    turn = scripted.Turn(reasoning, json.dumps(scripted.inert(schema)))
    script = Script(tuple(toolparse.pieces(toolparse.render(turn, plan.tool_parser))), True)
    return dataclasses.replace(plan, turn=turn, script=script)


async def _prompt(
    sim: Sim, req: CountTokensRequest
) -> tuple[list[int], list[int], str, tooluse.Plan]:
    try:
        sim.check_model(req.model)  # vLLM's own check and message, in Anthropic's shape
    except RequestError as err:
        raise _error(sim, 404, "NotFoundError", str(err)) from None
    chat = _chat_request(req)
    try:
        tooluse.check_tool_choice(sim.config, scripted.chat_tools(chat.tools), chat.tool_choice)
    except RequestError:  # the same check, answered in Anthropic's shape
        raise _error(sim, 400, "BadRequestError", tooluse.AUTO_TOOL_CHOICE_ERROR) from None
    plan = tooluse.chat_plan(sim.config, chat)
    if isinstance(req, MessagesRequest):
        plan = _structured(plan, req.output_config)
    text = protocol.render_chat(chat.messages, chat.tools)
    ids, hashes = await sim.tokenize(text)
    return ids, hashes, text, plan


async def count_tokens(sim: Sim, request: Request) -> Response:
    try:
        req = sim.parse(CountTokensRequest, await request.body())
        ids, _, _, _ = await _prompt(sim, req)
    except RequestError as err:
        return json_response(err.body, err.status)
    n = len(ids)
    return json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})


@dataclass(frozen=True, slots=True)
class _Prompt:
    ids: list[int]
    hashes: list[int]
    text: str
    plan: tooluse.Plan
    max_tokens: int
    temperature: float


async def messages(sim: Sim, request: Request) -> Response:
    async def prepare(req: MessagesRequest) -> _Prompt:
        ids, hashes, text, plan = await _prompt(sim, req)
        max_tokens, temperature = protocol.sampling(
            req.max_tokens, len(ids), sim.profile.max_model_len, req.temperature, req.top_p
        )
        return _Prompt(ids, hashes, text, plan, max_tokens, temperature)

    admitted = await preamble.admit(sim, request, MessagesRequest, prepare)
    if isinstance(admitted, Response):
        return admitted
    req, p = admitted
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    message_id = sim.request_id(request, None, "chatcmpl")
    ereq = sim.new_request(
        message_id,
        prompt_key=p.text,
        prompt_ids=p.ids,
        hashes=p.hashes,
        sampling=SamplingSpec(
            max_tokens=p.max_tokens,
            stop=tuple(req.stop_sequences or ()),
            temperature=p.temperature,
        ),
        n=1,
        seed=None,
        script=p.plan.script,
    )
    sim.submit(ereq)
    if req.stream:
        stream = mw.MessagesStream(
            message_id=message_id, model=sim.model, prompt_tokens=len(p.ids), d=sim.dialect
        )
        return sim.stream_response(ereq, _frames(sim, ereq, stream, p.plan))
    results = await preamble.collect(sim, ereq, request)
    if isinstance(results, Response):
        return results
    (r,) = results
    content: str | None = r.text
    reasoning: str | None = None
    calls: list[dict[str, Any]] = []
    finish: str | None = r.finish_reason
    if p.plan.parses:
        content, reasoning, calls = p.plan.parse_full(r.text)
        finish = _finish(p.plan, finish, bool(calls))
    return json_response(
        mw.message(
            message_id,
            sim.model,
            content,
            finish,
            len(p.ids),
            len(r.token_ids),
            _cached(sim, ereq),
            reasoning=reasoning,
            calls=calls,
            stop_reason=r.stop_reason,
            d=sim.dialect,
        )
    )


def _cached(sim: Sim, req: EngineRequest) -> int | None:
    """The prompt's cached tokens, reported apart with `--enable-prompt-tokens-details`."""
    return req.cached_tokens if sim.config.enable_prompt_tokens_details else None


def _finish(plan: tooluse.Plan, finish: str | None, called: bool) -> str | None:
    """The chat layer reports `tool_calls` for an auto call (a named tool_choice stays `stop`)."""
    return "tool_calls" if finish == "stop" and called and not plan.named else finish


async def _frames(
    sim: Sim, req: EngineRequest, stream: mw.MessagesStream, plan: tooluse.Plan
) -> FrameSource:
    parser = plan.parser() if plan.parses else None
    first = True
    tokens = 0
    while deltas := await req.take():
        out = [stream.start()] if first else []
        first = False
        for d in deltas:
            tokens += len(d.token_ids)
            if parser is None or d.finish_reason == "error":
                out += stream.delta(d.text, d.finish_reason, d.stop_reason)
                continue
            delta = parser.feed(d.text, d.token_ids, d.finish_reason is not None)
            finish = _finish(plan, d.finish_reason, parser.tool_calls_streamed)
            out += stream.chat_delta(delta, finish, d.stop_reason)
        if out:
            yield out
    sim.finished(req)
    if not req.aborted and not stream.failed:  # an engine error ended the stream already
        stream.cached = _cached(sim, req)
        yield stream.end(tokens)
