"""`/v1/chat/completions` and `/v1/completions`: validate, submit, then stream or collect."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from proxy import vllm_wire

from . import protocol, tooluse, wire
from .asgi import DropResponse, FrameSource, json_response
from .protocol import ChatRequest, CompletionRequest, RequestError
from .state import Prepared, Result, Sim


async def _generate(
    sim: Sim,
    request: Request,
    prepare: Callable[[], Awaitable[Prepared]],
    stream: Callable[[Prepared, int], FrameSource],
    answer: Callable[[Prepared, int, list[Result]], dict[str, Any]],
) -> Response:
    """What chat and completions share: gate, validate, submit, then stream or collect."""
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        p = await prepare()
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)
    if sim.drop_after() is not None and not p.stream:
        return DropResponse()
    if p.spec_conflict:
        return sim.spec_conflict_response(p)
    created = int(time.time())
    sim.submit(p.engine_req)
    if p.stream:
        return sim.stream_response(p.engine_req, stream(p, created))
    results = await sim.collect(p.engine_req, request.receive)
    if results is None:
        return Response(status_code=499)
    if sim.drop_after() is not None:
        return DropResponse()
    return json_response(answer(p, created, results))


_Req = TypeVar("_Req", ChatRequest, CompletionRequest)


async def _parsed(sim: Sim, request: Request, model: type[_Req]) -> _Req:
    """The request body, validated, for the served model (raises RequestError)."""
    req = sim.parse(model, await request.body())
    sim.check_model(req.model)
    return req


def _chunk_args(sim: Sim, p: Prepared, created: int) -> dict[str, Any]:
    """What a chat and a completions stream's chunks are built from alike."""
    return {
        "request_id": p.request_id,
        "created": created,
        "model": sim.model,
        "include_usage": p.include_usage,
        "continuous_usage": p.continuous_usage,
        "fingerprint": sim.fingerprint,
        "prompt_tokens": p.prompt_tokens,
        "return_token_ids": p.return_token_ids,
        **sim.chunk_dialect(),
    }


async def chat_completions(sim: Sim, request: Request) -> Response:
    plan = tooluse.Plan(None, None, False, None, {}, named=False)

    async def prepare() -> Prepared:
        nonlocal plan
        req = await _parsed(sim, request, ChatRequest)
        plan = tooluse.chat_plan(sim.config, req)
        return await sim.prepare(
            request,
            req,
            "chatcmpl",
            protocol.render_chat(req.messages, req.tools),
            None,
            plan.script,
        )

    def stream(p: Prepared, created: int) -> FrameSource:
        chunks = wire.ChatChunks(
            prompt_token_ids=p.prompt_ids,
            parsers=[plan.parser() for _ in range(p.engine_req.n)] if plan.parses else None,
            tool_finish=not plan.named,
            **_chunk_args(sim, p, created),
        )
        return _frames(sim, p, chunks.role, chunks.content, chunks.usage_chunk)

    def answer(p: Prepared, created: int, results: list[Result]) -> dict[str, Any]:
        choices: list[tuple[dict[str, Any], str, str | None, list[int] | None]] = []
        reasoning_tokens = 0
        for r in results:
            message = wire.chat_message(r.text, None, [])
            finish = r.finish_reason
            if plan.parses:
                parser = plan.parser()
                parser.count_tokens(r.token_ids)
                reasoning_tokens += parser.reasoning_tokens
                content, reasoning, calls = plan.parse_full(r.text)
                message = wire.chat_message(content, reasoning, calls)
                if calls and finish == "stop" and not plan.named:
                    finish = "tool_calls"
            ids = r.token_ids if p.return_token_ids else None
            choices.append((message, finish, r.stop_reason, ids))
        return wire.chat_response(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            choices=choices,
            prompt_tokens=p.prompt_tokens,
            completion_tokens=sum(len(r.token_ids) for r in results),
            fingerprint=sim.fingerprint,
            prompt_token_ids=p.prompt_ids if p.return_token_ids else None,
            metrics=sim.spec_metrics(p.engine_req, full=True),
            reasoning_tokens=reasoning_tokens if plan.reasoning else None,
            weight_versions=sim.dialect.weight_versions,
            prompt_details=sim.prompt_details(p.engine_req, chat=True),
        )

    return await _generate(sim, request, prepare, stream, answer)


async def _frames(
    sim: Sim,
    p: Prepared,
    role: Callable[[int], bytes] | None,
    content: Callable[..., bytes],
    usage_chunk: Callable[[int, dict[str, Any] | None, int], bytes],
) -> FrameSource:
    """A chat (with `role`) or completions stream: one list of frames per engine output.

    vLLM sends every choice's role chunk with the first engine output; completions repeat the
    prompt's token ids once per choice, on its first chunk, when asked for them.
    """
    req = p.engine_req
    completion = [0] * req.n
    sent_prompt = [False] * req.n
    first = True
    while True:
        deltas = await req.take()
        if not deltas:
            break
        out: list[bytes] = []
        if first and role is not None:
            out.extend(role(i) for i in range(req.n))
        first = False
        for d in deltas:
            if d.finish_reason == "error":
                # vLLM raises GenerationError: the step's text is not sent; a 500 error event
                # and [DONE] end the stream (no finish or usage chunk).
                yield [
                    *out,
                    sim.error_event(
                        "Internal server error", "InternalServerError", 500, chat=role is not None
                    ),
                    vllm_wire.DONE,
                ]
                sim.finished(req)
                return
            completion[d.index] += len(d.token_ids)
            args = [
                d.index,
                d.text,
                d.token_ids,
                completion[d.index],
                d.finish_reason,
                d.stop_reason,
            ]
            if role is None:  # completions
                prompt_ids = None
                if p.return_token_ids and not sent_prompt[d.index]:
                    prompt_ids = p.prompt_ids
                    sent_prompt[d.index] = True
                args.append(prompt_ids)
            frame = content(*args)
            if frame:  # a parser may hold a whole step back (no chunk)
                out.append(frame)
        if out:
            yield out
        delay = sim.frontend_delay()
        if delay > 0:
            await asyncio.sleep(delay)
    sim.finished(req)
    if req.aborted:
        return
    tail: list[bytes] = []
    if p.include_usage:
        tail.append(
            usage_chunk(sum(completion), sim.spec_metrics(req, full=False), req.cached_tokens)
        )
    tail.append(vllm_wire.DONE)
    yield tail


async def completions(sim: Sim, request: Request) -> Response:
    async def prepare() -> Prepared:
        req = await _parsed(sim, request, CompletionRequest)
        prompt = req.prompt
        text: str | None = None
        ids: list[int] | None = None
        if isinstance(prompt, str):
            text = prompt
        elif prompt and all(isinstance(x, int) for x in prompt):
            ids = [int(x) for x in prompt]  # type: ignore[arg-type]
        elif len(prompt) == 1:
            only = prompt[0]
            text, ids = (only, None) if isinstance(only, str) else (None, list(only))  # type: ignore[arg-type]
        else:
            raise protocol.bad_request("The simulator serves one prompt per request.", "prompt")
        return await sim.prepare(request, req, "cmpl", text, ids)

    def stream(p: Prepared, created: int) -> FrameSource:
        chunks = wire.CompletionChunks(**_chunk_args(sim, p, created))
        return _frames(sim, p, None, chunks.content, chunks.usage_chunk)

    def answer(p: Prepared, created: int, results: list[Result]) -> dict[str, Any]:
        choices: list[tuple[str, str, str | None, list[int] | None, list[int] | None]] = [
            (r.text, r.finish_reason, r.stop_reason, r.token_ids, p.prompt_ids)
            if p.return_token_ids
            else (r.text, r.finish_reason, r.stop_reason, None, None)
            for r in results
        ]
        return wire.completion_response(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            choices=choices,
            prompt_tokens=p.prompt_tokens,
            completion_tokens=sum(len(r.token_ids) for r in results),
            fingerprint=sim.fingerprint,
            metrics=sim.spec_metrics(p.engine_req, full=True),
            weight_versions=sim.dialect.weight_versions,
            prompt_details=sim.prompt_details(p.engine_req, chat=False),
        )

    return await _generate(sim, request, prepare, stream, answer)
