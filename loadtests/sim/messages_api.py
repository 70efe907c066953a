"""`/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API on the same engine,
as vLLM 0.28 serves it (a chat request underneath; bytes from messages_wire.py).

A body that does not validate gets vLLM's generic OpenAI-shaped 400 (the Anthropic handler never
sees it); errors the handler returns (unknown model, tools without a tool parser) are
Anthropic-shaped with vLLM's internal type names.
"""

from __future__ import annotations

from typing import Any

from pydantic import field_validator
from starlette.requests import Request
from starlette.responses import Response

from . import messages_wire as mw
from . import protocol
from .asgi import DropResponse, FrameSource, json_response
from .engine import EngineRequest, SamplingSpec
from .protocol import ChatMessage, RequestError
from .state import Sim

_AUTO_TOOLS = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)


class _Message(protocol._Base):
    role: str
    content: str | list[dict[str, Any]]


class CountTokensRequest(protocol._Base):
    model: str
    messages: list[_Message]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    @field_validator("max_tokens")
    @classmethod
    def _positive(cls, value: int) -> int:
        if value <= 0:
            raise ValueError("max_tokens must be positive")
        return value


def _error(status: int, err_type: str, message: str) -> RequestError:
    return RequestError(status, mw.anthropic_error(err_type, message))


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
            out.append(ChatMessage(role=m.role, content=m.content))
    if system:
        out.insert(0, ChatMessage(role="system", content="".join(system)))
    return out


async def _prompt(sim: Sim, req: CountTokensRequest) -> tuple[list[int], list[int], str]:
    if req.model != sim.model:
        raise _error(404, "NotFoundError", f"The model `{req.model}` does not exist.")
    if req.tools:  # vLLM sets tool_choice "auto" whenever tools are given
        raise _error(400, "BadRequestError", _AUTO_TOOLS)
    text = protocol.render_chat(_chat_messages(req), None)
    ids, hashes = await sim.tokenize(text)
    return ids, hashes, text


async def count_tokens(sim: Sim, request: Request) -> Response:
    try:
        req = protocol.parse(CountTokensRequest, await request.body())
        ids, _, _ = await _prompt(sim, req)
    except RequestError as err:
        return json_response(err.body, err.status)
    n = len(ids)
    return json_response({"input_tokens": n, "context_management": {"original_input_tokens": n}})


async def messages(sim: Sim, request: Request) -> Response:
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        req = protocol.parse(MessagesRequest, await request.body())
        prompt_ids, hashes, text = await _prompt(sim, req)
        max_tokens = protocol.resolve_max_tokens(
            req.max_tokens, len(prompt_ids), sim.profile.max_model_len
        )
        temperature = 1.0 if req.temperature is None else req.temperature
        protocol.check_sampling(1, temperature, req.top_p, max_tokens)
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    message_id = sim.request_id(request, None, "chatcmpl")
    ereq = sim.new_request(
        message_id,
        prompt_key=text,
        prompt_ids=prompt_ids,
        hashes=hashes,
        sampling=SamplingSpec(
            max_tokens=max_tokens, stop=tuple(req.stop_sequences or ()), temperature=temperature
        ),
        n=1,
        seed=None,
    )
    sim.submit(ereq)
    if req.stream:
        stream = mw.MessagesStream(
            message_id=message_id, model=sim.model, prompt_tokens=len(prompt_ids)
        )
        return sim.stream_response(ereq, _frames(sim, ereq, stream))
    results = await sim.collect(ereq, request.receive)
    if results is None:
        return Response(status_code=499)
    if sim.drop_after() is not None:
        return DropResponse()
    (r,) = results
    return json_response(
        mw.message(
            message_id, sim.model, r.text, r.finish_reason, len(prompt_ids), len(r.token_ids), None
        )
    )


async def _frames(sim: Sim, req: EngineRequest, stream: mw.MessagesStream) -> FrameSource:
    first = True
    tokens = 0
    while deltas := await req.take():
        out = [stream.start()] if first else []
        first = False
        for d in deltas:
            tokens += len(d.token_ids)
            out += stream.delta(d.text, d.finish_reason)
        if out:
            yield out
    sim.finished(req)
    if not req.aborted:
        yield stream.end(tokens)
