"""`/v1/messages` and `/v1/responses` in the simulator's SGLang mode: SGLang 0.5.23 serves both
(its `AnthropicServing` over its chat serving, its `OpenAIServingResponses`), so the simulator
does, on the same engine and checks as vLLM mode (messages_api.py, responses_api.py), answered
in SGLang's bytes (sglang_typed_wire.py). Text answers only: a request's tools are not planned
(the engine writes text), reasoning and stored responses are not imitated."""

from __future__ import annotations

import secrets
import time
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from . import messages_api, preamble, protocol
from . import sglang_typed_wire as w
from .asgi import DropResponse, FrameSource, json_response
from .engine import EngineRequest, SamplingSpec
from .protocol import ResponsesRequest
from .state import Sim


class _Prompt:
    __slots__ = ("key", "ids", "hashes", "max_tokens", "temperature")

    def __init__(
        self, key: str, ids: list[int], hashes: list[int], max_tokens: int, temperature: float
    ) -> None:
        self.key, self.ids, self.hashes = key, ids, hashes
        self.max_tokens, self.temperature = max_tokens, temperature


async def _take(sim: Sim, req: EngineRequest, delta: Any, end: Any) -> FrameSource:
    """The engine's outputs as frames: `delta(text)` for each, `end(finish, tokens)` after."""
    tokens, finish = 0, None
    while deltas := await req.take():
        out: list[bytes] = []
        for d in deltas:
            tokens += len(d.token_ids)
            finish = d.finish_reason or finish
            out += delta(d.text)
        if out:
            yield out
    sim.finished(req)
    if not req.aborted:
        yield end(finish, tokens)


def _engine_request(sim: Sim, rid: str, p: _Prompt, stop: tuple[str, ...] = ()) -> EngineRequest:
    ereq = sim.new_request(
        rid,
        prompt_key=p.key,
        prompt_ids=p.ids,
        hashes=p.hashes,
        sampling=SamplingSpec(max_tokens=p.max_tokens, stop=stop, temperature=p.temperature),
        n=1,
        seed=None,
        script=None,
    )
    sim.submit(ereq)
    return ereq


async def messages(sim: Sim, request: Request) -> Response:
    async def prepare(req: messages_api.MessagesRequest) -> _Prompt:
        ids, hashes, text, _ = await messages_api._prompt(sim, req)  # the same checks as vLLM's
        max_tokens, temperature = protocol.sampling(
            req.max_tokens, len(ids), sim.profile.max_model_len, req.temperature, req.top_p
        )
        return _Prompt(text, ids, hashes, max_tokens, temperature)

    admitted = await preamble.admit(sim, request, messages_api.MessagesRequest, prepare)
    if isinstance(admitted, Response):
        return admitted
    req, p = admitted
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    message_id = f"msg_{secrets.token_hex(16)}"
    ereq = _engine_request(sim, message_id, p, tuple(req.stop_sequences or ()))
    if req.stream:
        stream = w.MessagesStream(message_id, sim.model, len(p.ids))
        return sim.stream_response(ereq, _take(sim, ereq, stream.delta, stream.end))
    results = await preamble.collect(sim, ereq, request)
    if isinstance(results, Response):
        return results
    (r,) = results
    body = w.message_body(
        message_id, sim.model, r.text, r.finish_reason, len(p.ids), len(r.token_ids)
    )
    return json_response(body)


async def responses(sim: Sim, request: Request) -> Response:
    async def prepare(req: ResponsesRequest) -> _Prompt:
        sim.check_model(req.model)
        chat = protocol.render_responses_input(req)
        ids, hashes = await sim.tokenize(protocol.render_chat(chat, None))
        max_tokens, temperature = protocol.sampling(
            req.max_output_tokens, len(ids), sim.profile.max_model_len, req.temperature, req.top_p
        )
        key = ("responses", [m.model_dump() for m in chat]).__repr__()
        return _Prompt(key, ids, hashes, max_tokens, temperature)

    admitted = await preamble.admit(sim, request, ResponsesRequest, prepare)
    if isinstance(admitted, Response):
        return admitted
    req, p = admitted
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    raw: dict[str, Any] = orjson.loads(await request.body())  # echoed as SGLang echoes it
    response_id, item_id = f"resp_{secrets.token_hex(16)}", f"msg_{secrets.token_hex(16)}"
    created = int(time.time())
    ereq = _engine_request(sim, response_id, p)
    if req.stream:
        stream = w.ResponsesStream(raw, response_id, item_id, created, sim.model)
        opening = stream.start()

        def end(finish: str | None, tokens: int) -> list[bytes]:
            return stream.end(finish, len(p.ids), tokens)

        async def frames() -> FrameSource:
            yield opening
            async for out in _take(sim, ereq, stream.delta, end):
                yield out

        return sim.stream_response(ereq, frames())
    results = await preamble.collect(sim, ereq, request)
    if isinstance(results, Response):
        return results
    (r,) = results
    body = w.responses_body(
        raw,
        response_id,
        item_id,
        created,
        sim.model,
        r.text,
        finish=r.finish_reason,
        prompt=len(p.ids),
        output=len(r.token_ids),
    )
    return json_response(body)


async def count_tokens(sim: Sim, request: Request) -> Response:
    """SGLang's `AnthropicCountTokensResponse`: the count alone."""
    try:
        req = sim.parse(messages_api.CountTokensRequest, await request.body())
        ids, _, _, _ = await messages_api._prompt(sim, req)
    except protocol.RequestError as err:
        return json_response(err.body, err.status)
    return json_response({"input_tokens": len(ids)})
