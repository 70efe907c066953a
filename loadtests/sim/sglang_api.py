"""`/v1/chat/completions` and `/v1/completions` in the simulator's SGLang mode: the same engine,
validation and scheduling as vLLM mode (generate.py), answered with SGLang's bytes
(sglang_wire.py). Its spec figures (`sglext.spec_tokens_details`) come when the request asks
`return_spec_tokens_details`: `spec_verify_ct` the request's drafted steps, every decode step
of the simulated engine (it drafts at every step, as SGLang's speculative modes do)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from policies.capabilities import SGLANG_ASK
from policies.capabilities import SglangFamily as F
from proxy.vllm_wire import Family, counter_sample

from . import protocol, sglang_wire
from .asgi import FrameSource
from .generate import _generate, _parsed
from .protocol import ChatRequest, CompletionRequest
from .state import Prepared, Result, Sim


async def _asked(request: Request) -> bool:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError:
        return False
    return isinstance(body, dict) and body.get(SGLANG_ASK) is True


def _details(sim: Sim, p: Prepared, completion: int) -> dict[str, Any] | None:
    req = p.engine_req
    if not req.sequences:
        return None
    stats = req.sequences[0].spec
    k = sim.config.profile.num_spec_tokens
    return sglang_wire.spec_details(completion, stats.steps, stats.accepted, stats.drafted, k)


async def _frames(sim: Sim, p: Prepared, created: int, chat: bool, asked: bool) -> FrameSource:
    req = p.engine_req
    frames = sglang_wire.Frames(
        request_id=p.request_id,
        created=created,
        model=sim.model,
        chat=chat,
        prompt_tokens=p.prompt_tokens,
    )
    completion = [0] * req.n
    while True:
        deltas = await req.take()
        if not deltas:
            break
        out: list[bytes] = []
        for d in deltas:
            completion[d.index] += len(d.token_ids)
            stop = d.stop_reason if isinstance(d.stop_reason, str) else None
            out += frames.step(
                d.index,
                d.text,
                completion[d.index],
                d.finish_reason,
                stop,
                continuous=p.continuous_usage,
            )
        if out:
            yield out
        delay = sim.frontend_delay()
        if delay > 0:
            await asyncio.sleep(delay)
    sim.finished(req)
    if req.aborted:
        return
    total = sum(completion)
    details = _details(sim, p, total) if asked else None
    yield frames.tail(total, details, p.include_usage)


async def _serve(sim: Sim, request: Request, chat: bool) -> Response:
    asked = await _asked(request)

    async def prepare() -> Prepared:
        if chat:
            req = await _parsed(sim, request, ChatRequest)
            text = protocol.render_chat(req.messages, req.tools)
            return await sim.prepare(request, req, "chatcmpl", text, None)
        creq = await _parsed(sim, request, CompletionRequest)
        if not isinstance(creq.prompt, str):
            raise protocol.bad_request("The simulator's SGLang mode serves text prompts.", "prompt")
        return await sim.prepare(request, creq, "cmpl", creq.prompt, None)

    def stream(p: Prepared, created: int) -> FrameSource:
        return _frames(sim, p, created, chat, asked)

    def answer(p: Prepared, created: int, results: list[Result]) -> dict[str, Any]:
        completion = sum(len(r.token_ids) for r in results)
        return sglang_wire.body(
            request_id=p.request_id,
            created=created,
            model=sim.model,
            chat=chat,
            choices=[
                (r.text, r.finish_reason, r.stop_reason if isinstance(r.stop_reason, str) else None)
                for r in results
            ],
            prompt_tokens=p.prompt_tokens,
            completion_tokens=completion,
            details=_details(sim, p, completion) if asked else None,
        )

    return await _generate(sim, request, prepare, stream, answer)


async def chat_completions(sim: Sim, request: Request) -> Response:
    return await _serve(sim, request, chat=True)


async def completions(sim: Sim, request: Request) -> Response:
    return await _serve(sim, request, chat=False)


def metrics_page(sim: Sim) -> bytes:
    """SGLang's families from the engine's own counters (the vLLM ones it keeps either way):
    the drafted steps are the verify calls, the finished requests SGLang's `num_requests`."""
    m = sim.metrics
    labels = m._labels  # the engine's series

    def read(sample: str, **extra: str) -> float:
        return m.registry.get_sample_value(sample, {**labels, **extra}) or 0.0

    success = counter_sample(Family.REQUEST_SUCCESS)
    finished = sum(read(success, finished_reason=r) for r in m.success)
    return sglang_wire.metrics_page(
        sim.model,
        {
            F.RUNNING: read(Family.RUNNING),
            F.WAITING: read(Family.WAITING),
            F.KV_USAGE: read(Family.KV_CACHE_USAGE),
            F.SPEC_VERIFY_CALLS: read(counter_sample(Family.SPEC_DRAFTS)),
            F.GENERATION_TOKENS: read(counter_sample(Family.GENERATION_TOKENS)),
            F.REQUESTS: finished,
            F.PROMPT_TOKENS: read(counter_sample(Family.PROMPT_TOKENS)),
            F.CACHED_TOKENS: read(counter_sample(Family.PREFIX_CACHE_HITS)),
        },
    )
