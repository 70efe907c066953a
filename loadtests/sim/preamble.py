"""What `/v1/messages` and `/v1/responses` do before and after the engine: count the request,
the engine-state gate, parse and validate the body (the Dialect's 400), the endpoint's own
checks (model, prompt, sampling); then, for a non-streaming answer, the wait and the `drop`
fault. A RequestError on the way is answered with its body."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response

from .asgi import DropResponse, json_response
from .engine import EngineRequest
from .protocol import RequestError
from .state import Result, Sim

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


async def admit(
    sim: Sim, request: Request, model: type[M], prepare: Callable[[M], Awaitable[T]]
) -> tuple[M, T] | Response:
    """The parsed body and what `prepare` made of it, or the response that refuses it."""
    sim.stats.requests += 1
    gated = sim.gate()
    if gated is not None:
        return gated
    try:
        req = sim.parse(model, await request.body())
        return req, await prepare(req)
    except RequestError as err:
        sim.stats.errors += 1
        return json_response(err.body, err.status)


async def collect(sim: Sim, ereq: EngineRequest, request: Request) -> list[Result] | Response:
    """A non-streaming request's results, or 499 (client gone) / the `drop` fault's response."""
    results = await sim.collect(ereq, request.receive)
    if results is None:
        return Response(status_code=499)
    if sim.drop_after() is not None:
        return DropResponse()
    return results
