"""The admin listener: metrics for Prometheus, and the admin API behind the admin token.

Not reachable from the public listener. `/metrics` is open on this listener (it is bound to
loopback by default) so Prometheus needs no credentials; everything under `/admin` and the
dashboard need the admin token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from proxy import auth
from proxy.gateway import Gateway
from proxy.relay.errors import error_body


def require_admin(gw: Gateway, request: Request) -> Response | None:
    """None when the request carries the admin token, else the 401 to send."""
    expected = gw.settings.admin_token
    token = auth.bearer(request.headers.get("authorization", "").encode("latin-1") or None)
    if expected and token is not None and auth.token_matches(token, auth.hash_key(expected)):
        return None
    return Response(error_body(401, "admin token required", type_="AuthenticationError"),
                    status_code=401, media_type="application/json",
                    headers={"www-authenticate": "Bearer"})


Handler = Callable[[Request], Awaitable[Response]]


def guarded(gw: Gateway, handler: Handler) -> Handler:
    async def wrapper(request: Request) -> Response:
        denied = require_admin(gw, request)
        return denied if denied is not None else await handler(request)
    return wrapper


def create_admin_app(gw: Gateway, extra_routes: list[BaseRoute] | None = None) -> Starlette:
    async def metrics(_: Request) -> Response:
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def status(_: Request) -> Response:
        policy = gw.policy.current
        state = gw.live.snapshot()
        backends: dict[str, Any] = {
            name: {"health": b.health, "in_flight": b.in_flight, "running": b.running,
                   "waiting": b.waiting, "kv_usage": b.kv_usage, "acceptance": b.acceptance}
            for name, b in state.backends.items()}
        return JSONResponse({"policy_version": policy.version, "backends": backends,
                             "in_flight": len(gw.in_flight)})

    routes: list[BaseRoute] = [
        Route("/metrics", metrics),
        Route("/healthz", lambda _: JSONResponse({"status": "ok"})),
        Route("/admin/status", guarded(gw, status)),
        *(extra_routes or []),
    ]
    return Starlette(routes=routes)
