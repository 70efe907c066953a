"""`/v1/responses`: the Responses API on the same engine (typed events, no `[DONE]`)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from . import preamble, protocol, tooluse
from .asgi import DropResponse, FrameSource, json_response
from .engine import EngineRequest, SamplingSpec
from .protocol import ChatMessage, ResponsesRequest
from .responses_tools import ResponsesItems
from .responses_wire import ResponsesEvents
from .state import Sim


@dataclass(frozen=True, slots=True)
class _Prompt:
    messages: list[ChatMessage]
    plan: tooluse.Plan
    ids: list[int]
    hashes: list[int]
    max_tokens: int
    temperature: float


async def responses(sim: Sim, request: Request) -> Response:
    async def prepare(req: ResponsesRequest) -> _Prompt:
        sim.check_model(req.model)
        messages = protocol.render_responses_input(req)
        plan = tooluse.responses_plan(sim.config, req, messages)
        ids, hashes = await sim.tokenize(protocol.render_chat(messages, req.tools))
        max_tokens, temperature = protocol.sampling(
            req.max_output_tokens, len(ids), sim.profile.max_model_len, req.temperature, req.top_p
        )
        return _Prompt(messages, plan, ids, hashes, max_tokens, temperature)

    admitted = await preamble.admit(sim, request, ResponsesRequest, prepare)
    if isinstance(admitted, Response):
        return admitted
    req, p = admitted
    messages, plan, prompt_ids, temperature = p.messages, p.plan, p.ids, p.temperature
    if sim.drop_after() is not None and not req.stream:
        return DropResponse()
    rid = request.headers.get("x-request-id") or secrets.token_hex(8)
    ereq = sim.new_request(
        f"resp_{rid}",
        prompt_key=("responses", [m.model_dump() for m in messages]).__repr__(),
        prompt_ids=prompt_ids,
        hashes=p.hashes,
        sampling=SamplingSpec(max_tokens=p.max_tokens, temperature=temperature),
        n=1,
        seed=req.seed,
        script=plan.script,
    )
    events = ResponsesEvents(
        dialect=sim.dialect,
        response_id=f"resp_{rid}",
        created=int(time.time()),
        model=sim.model,
        temperature=temperature,
        max_output_tokens=p.max_tokens,
        instructions=req.instructions,
        tools=req.tools,
        tool_choice=req.tool_choice,
        reasoning=req.reasoning,
    )
    custom = {str(t.get("name")) for t in req.tools or [] if t.get("type") == "custom"}
    items = ResponsesItems(events, custom)
    sim.submit(ereq)
    if req.stream:
        if plan.parses:
            return sim.stream_response(ereq, _parsed_frames(sim, ereq, events, plan, items))
        return sim.stream_response(ereq, _responses_frames(sim, ereq, events))
    results = await preamble.collect(sim, ereq, request)
    if isinstance(results, Response):
        return results
    (result,) = results
    text = result.text
    truncated = result.finish_reason == "length"
    status = "incomplete" if truncated else "completed"
    output = [events.message(text, events.item_status(truncated), f"msg_{secrets.token_hex(8)}")]
    reasoning_tokens = 0
    if plan.parses:
        parser = plan.parser()
        parser.count_tokens(result.token_ids)
        reasoning_tokens = parser.reasoning_tokens
        output = items.full(*plan.parse_full(text), truncated=truncated)
    usage = events.usage(
        len(prompt_ids), len(result.token_ids), ereq.cached_tokens, reasoning_tokens
    )
    body = events.response(status, output, usage)
    return json_response(body)


async def _parsed_frames(
    sim: Sim, req: EngineRequest, ev: ResponsesEvents, plan: tooluse.Plan, items: ResponsesItems
) -> FrameSource:
    """A stream whose output goes through the reasoning/tool parsers (responses_tools.py)."""
    in_progress = ev.response("in_progress", [], None)
    yield [
        ev.event("response.created", {"response": in_progress}),
        ev.event("response.in_progress", {"response": in_progress}),
    ]
    parser = plan.parser()
    ntok = 0
    finish = "stop"
    while deltas := await req.take():
        out: list[bytes] = []
        for d in deltas:
            ntok += len(d.token_ids)
            finish = d.finish_reason or finish
            delta = parser.feed(d.text, d.token_ids, d.finish_reason is not None)
            if delta is not None:
                out += items.feed(delta)
        if out:
            yield out
    sim.finished(req)
    if req.aborted:
        return
    truncated = finish == "length"
    tail = items.close(truncated)
    status = "incomplete" if truncated else "completed"
    usage = ev.usage(req.prompt_len, ntok, req.cached_tokens, parser.reasoning_tokens)
    response = ev.response(status, items.output, usage)
    yield [*tail, ev.event(ev.final_event(status), {"response": response})]


async def _responses_frames(sim: Sim, req: EngineRequest, ev: ResponsesEvents) -> FrameSource:
    in_progress = ev.response("in_progress", [], None)
    yield [
        ev.event("response.created", {"response": in_progress}),
        ev.event("response.in_progress", {"response": in_progress}),
    ]
    first = True
    parts: list[str] = []
    ntok = 0
    finish = "stop"
    while True:
        deltas = await req.take()
        if not deltas:
            break
        out: list[bytes] = []
        if first:
            out.append(
                ev.event(
                    "response.output_item.added",
                    {"item": ev.message(None, "in_progress"), "output_index": 0},
                )
            )
            out.append(
                ev.event(
                    "response.content_part.added",
                    {
                        "content_index": 0,
                        "item_id": ev.item_id,
                        "output_index": 0,
                        "part": ev.part(""),
                    },
                )
            )
            first = False
        for d in deltas:
            ntok += len(d.token_ids)
            finish = d.finish_reason or finish
            if d.text:
                parts.append(d.text)
                out.append(ev.text_delta(d.text))
        if out:
            yield out
    sim.finished(req)
    if req.aborted:
        return
    text = "".join(parts)
    truncated = finish == "length"
    # vLLM 0.28 ends a truncated answer with response.completed, status "incomplete" inside
    # it; 0.33 with response.incomplete (ResponsesEvents.final_event).
    status = "incomplete" if truncated else "completed"
    item_status = ev.item_status(truncated)
    done = ev.message_done(text, item_status)
    final = ev.message(text, item_status, ev.final_item_id(ev.item_id))
    usage = ev.usage(req.prompt_len, ntok, req.cached_tokens)
    yield [
        *ev.text_done(text, ev.item_id, 0),
        ev.event("response.output_item.done", {"item": done, "output_index": 0}),
        ev.event(ev.final_event(status), {"response": ev.response(status, [final], usage)}),
    ]
