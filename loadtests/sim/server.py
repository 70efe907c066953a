"""The simulated vLLM server: a Starlette app in front of one Engine.

Handlers turn requests into EngineRequests and the engine's per-step output into vLLM's bytes:
chat and completions in generate.py, /v1/responses in responses_api.py, /v1/messages in
messages_api.py, embeddings in
embeddings.py, the server's state in state.py, SSE and crash responses in asgi.py. This module
holds the small endpoints and assembles the app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy import vllm_wire

from . import sglang_api, sglang_typed_api, wire
from .asgi import TRANSPORT_KEY, json_response
from .embeddings import embeddings
from .faults import FaultError
from .generate import chat_completions, completions
from .messages_api import count_tokens, messages
from .responses_api import responses
from .state import SESSION, Sim, SimConfig


def _route(
    handler: Callable[[Sim, Request], Awaitable[Response]], sim: Sim
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        traceparent = request.headers.get("traceparent")
        if traceparent is not None and sim.config.faults:
            sim.saw_traceparent(request.headers.get("x-request-id", ""), traceparent)
        if (sim.config.faults or sim.kv is not None) and request.url.path in _SESSION_PATHS:
            await _note_session(sim, request)
        return await handler(sim, request)

    return endpoint


_SESSION_PATHS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
}


async def _note_session(sim: Sim, request: Request) -> None:
    """The session id the request's KV blocks get (`SESSION`, for the engine request)."""
    raw = await request.body()  # kept by the request for the handler
    body: object = {}
    if b'"session_id"' in raw:  # parsed only when it may name one
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
    if isinstance(body, dict):
        endpoint = _SESSION_PATHS[request.url.path]
        header = request.headers.get(vllm_wire.SESSION_HEADER)
        session = vllm_wire.engine_session(sim.config.vllm_version, endpoint, body, header)
        SESSION.set(session)
        if sim.config.faults:
            sim.saw_session(request.headers.get("x-request-id", ""), session)


async def health(sim: Sim, request: Request) -> Response:
    ok = not sim.engine.dead and (not sim.config.faults or sim.faults.health_ok())
    return Response(status_code=200 if ok else 503)


async def version(sim: Sim, request: Request) -> Response:
    c = sim.config
    return json_response(
        {
            "version": c.vllm_version,
            "specrouter_sim": {
                "profile": sim.profile.name,
                "time_scale": c.time_scale,
                "seed": c.seed,
                "speculative_config": sim.profile.speculative_config,
                "served_model_name": sim.model,
                "max_num_seqs": c.max_num_seqs,
                "num_spec_tokens": sim.profile.num_spec_tokens,
                "per_request_spec_decode_metrics": c.spec_metrics,
            },
        }
    )


async def models(sim: Sim, request: Request) -> Response:
    gated = sim.gate(generation=False)
    if gated is not None:
        return gated
    return json_response(
        wire.model_list(
            model=sim.model,
            root=sim.profile.model_path,
            max_model_len=sim.profile.max_model_len,
            created=sim.created,
            perm_id=sim.perm_id,
        )
    )


async def metrics(sim: Sim, request: Request) -> Response:
    if sim.config.engine_kind == "sglang":
        return Response(sglang_api.metrics_page(sim), headers={"content-type": "text/plain"})
    body, content_type = sim.metrics.exposition(request.headers.get("accept", ""))
    return Response(body, headers={"content-type": content_type})


async def load(sim: Sim, request: Request) -> Response:
    return json_response({"server_load": 0})


async def sim_requests(sim: Sim, request: Request) -> Response:
    """Test-only truth: each recently finished request's own speculative counters, by id."""
    return json_response(dict(sim.finished_spec))


async def sim_traceparents(sim: Sim, request: Request) -> Response:
    """Test-only truth: the `traceparent` recent requests came with, by `x-request-id`."""
    return json_response(dict(sim.traceparents))


async def sim_sessions(sim: Sim, request: Request) -> Response:
    """Test-only truth: the session id recent requests' KV blocks are tagged with, by id."""
    return json_response(dict(sim.sessions))


async def sim_blocks(sim: Sim, request: Request) -> Response:
    """Test-only truth: the block hashes the prefix cache holds (what its KV events say)."""
    return json_response({"blocks": sim.core.cache.hashes()})


async def sim_priorities(sim: Sim, request: Request) -> Response:
    """Test-only truth: the `priority` recent requests came with, by request id, in order."""
    return json_response(dict(sim.priorities))


async def sim_stats(sim: Sim, request: Request) -> Response:
    s = sim.stats
    return json_response(
        {
            "requests": s.requests,
            "completed": s.completed,
            "aborted": s.aborted,
            "dropped": s.dropped,
            "errors": s.errors,
            "running": len(sim.core.running),
            "waiting": len(sim.core.waiting),
            "active_faults": sim.faults.active(),
            "steps": sim.core.steps,
            "profile": sim.profile.name,
            "time_scale": sim.config.time_scale,
        }
    )


async def sim_faults(sim: Sim, request: Request) -> Response:
    if request.method == "DELETE":
        sim.faults.clear()
    elif request.method == "POST":
        try:
            data = orjson.loads(await request.body())
            if not isinstance(data, dict) or not isinstance(data.get("mode"), str):
                raise FaultError('body must be {"mode": MODE, ...params}')
            mode = data.pop("mode")
            sim.faults.set(mode, data)
        except (FaultError, orjson.JSONDecodeError) as err:
            return json_response(vllm_wire.error_body(str(err), "BadRequestError", 400), 400)
    return json_response({"active_faults": sim.faults.active()})


class _Edge:
    """Outermost ASGI layer: remembers the connection's transport (simulated crashes close it)
    and checks the API key like vLLM's middleware (only /v1, /v2, /inference, /cohere paths)."""

    def __init__(self, app: ASGIApp, api_key: str | None) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            # uvicorn's `send` is a bound method of the request cycle, which holds the transport.
            transport = getattr(getattr(send, "__self__", None), "transport", None)
            if transport is not None:
                scope[TRANSPORT_KEY] = transport
            if (
                self.expected is not None
                and scope["method"] != "OPTIONS"
                and scope["path"].startswith(("/v1", "/v2", "/inference", "/cohere"))
                and dict(scope["headers"]).get(b"authorization") != self.expected
            ):
                await json_response({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
            rid = dict(scope["headers"]).get(b"x-request-id")
            if rid is not None:  # as vLLM with --enable-request-id-headers (the deploy's flag)
                send = _echoing(send, rid)
        await self.app(scope, receive, send)


def _echoing(send: Send, rid: bytes) -> Send:
    async def echo(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), (b"x-request-id", rid)]}
        await send(message)

    return echo


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    from http import HTTPStatus

    phrase = HTTPStatus(exc.status_code).phrase
    body = vllm_wire.error_body(str(exc.detail), phrase, exc.status_code)
    return json_response(body, exc.status_code)


def create_app(config: SimConfig) -> tuple[ASGIApp, Sim]:
    sim = Sim(config)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sim.engine.start()
        try:
            yield
        finally:
            sim.abort_all()
            await sim.engine.stop()
            if sim.kv is not None:
                sim.kv.close()

    def r(
        path: str, handler: Callable[[Sim, Request], Awaitable[Response]], methods: list[str]
    ) -> Route:
        return Route(path, _route(handler, sim), methods=methods)

    routes = [
        r("/health", health, ["GET"]),
        r("/ping", health, ["GET", "POST"]),
        r("/version", version, ["GET"]),
        r("/metrics", metrics, ["GET"]),
        r("/load", load, ["GET"]),
        r("/v1/models", models, ["GET"]),
    ]
    if config.profile.kind == "embed":
        routes.append(r("/v1/embeddings", embeddings, ["POST"]))
    elif config.engine_kind == "sglang":
        routes += [
            r("/v1/chat/completions", sglang_api.chat_completions, ["POST"]),
            r("/v1/completions", sglang_api.completions, ["POST"]),
            r("/v1/responses", sglang_typed_api.responses, ["POST"]),
            r("/v1/messages", sglang_typed_api.messages, ["POST"]),
            r("/v1/messages/count_tokens", sglang_typed_api.count_tokens, ["POST"]),
        ]
    else:
        routes += [
            r("/v1/chat/completions", chat_completions, ["POST"]),
            r("/v1/completions", completions, ["POST"]),
            r("/v1/responses", responses, ["POST"]),
            r("/v1/messages", messages, ["POST"]),
            r("/v1/messages/count_tokens", count_tokens, ["POST"]),
        ]
    if config.faults:
        routes += [
            r("/_sim/faults", sim_faults, ["GET", "POST", "DELETE"]),
            r("/_sim/stats", sim_stats, ["GET"]),
            r("/_sim/requests", sim_requests, ["GET"]),
            r("/_sim/traceparents", sim_traceparents, ["GET"]),
            r("/_sim/priorities", sim_priorities, ["GET"]),
            r("/_sim/sessions", sim_sessions, ["GET"]),
            r("/_sim/blocks", sim_blocks, ["GET"]),
        ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _http_error}
    )
    return _Edge(app, config.api_key), sim
