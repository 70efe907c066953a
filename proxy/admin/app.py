"""The admin listener: metrics for Prometheus, and the admin API behind the admin token.

Not reachable from the public listener. `/metrics` is open on this listener (it is bound to
loopback by default) so Prometheus needs no credentials, unless `--scrape-token` is set; every
`/admin` operation needs an admin token (the audit records its name), the dashboard an admin
or dashboard token. Failed authentication is throttled per source address (proxy/throttle.py). The API's description (`/admin/openapi.json`) and its
interactive docs (`/admin/docs`, Swagger UI served from this process: no CDN) are open too:
they hold no state, and trying an operation there still takes the token ("Authorize").
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Security
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPBearer
from fastapi_offline import FastAPIOffline
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute

from proxy.admin.identity import AdminAuth, Denied, admin_auth
from proxy.admin.models import ErrorOut, ReadyOut, StatusOut
from proxy.gateway import Gateway
from proxy.relay.errors import error_body
from proxy.relay.ready import readiness

# Documents the scheme (Swagger UI's Authorize button); the token itself is checked below.
_BEARER = HTTPBearer(auto_error=False, description="The gateway's `--admin-token`.")
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "No admin token."},
    429: {
        "model": ErrorOut,
        "description": "Too many failed authentications from this address "
        "(`Retry-After` says when to try again).",
    },
}


class AdminError(Exception):
    """An admin operation refused: answered `status` with the error body (plus `extra` keys)."""

    def __init__(self, status: int, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.message, self.extra = status, message, extra


def require_admin(request: Request) -> str:
    """The name of the admin token the request carries, else Denied (401, or 429)."""
    checker = admin_auth(request)
    return checker.identify(request, checker.admin)


def admin_router(gw: Gateway) -> APIRouter:
    """A router whose every operation needs an admin token, checked before anything else; the
    token's name is `request.state.admin` (the audit's "who")."""

    async def guard(request: Request, _: Annotated[Any, Security(_BEARER)]) -> None:
        request.state.admin = require_admin(request)

    return APIRouter(dependencies=[Depends(guard)], responses=UNAUTHORIZED)


def _handlers(gw: Gateway) -> dict[Any, Callable[[Request, Any], Coroutine[Any, Any, Response]]]:
    """Exception handlers that keep the answers the hand-routed Starlette app gave."""

    async def denied(_: Request, exc: Denied) -> Response:
        return exc.response

    async def refused(_: Request, exc: AdminError) -> Response:
        body = orjson.loads(error_body(exc.status, exc.message))
        body["error"].update(exc.extra)
        return Response(orjson.dumps(body), status_code=exc.status, media_type="application/json")

    async def http_error(_: Request, exc: HTTPException) -> Response:
        # Starlette's plain-text 404 and 405 (with Allow), not FastAPI's {"detail": ...}.
        if exc.status_code in (204, 304):
            return Response(status_code=exc.status_code, headers=exc.headers)
        return PlainTextResponse(exc.detail, status_code=exc.status_code, headers=exc.headers)

    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        # No operation lets FastAPI validate a body (each reads its own, to check preconditions
        # first); a bad query or header still gets the OpenAI error shape, as 400, not 422.
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return await refused(
            request, AdminError(400, f"{where}: {first.get('msg', 'invalid request')}")
        )

    return {
        Denied: denied,
        AdminError: refused,
        HTTPException: http_error,
        RequestValidationError: invalid,
    }


def create_admin_app(gw: Gateway, extra_routes: list[BaseRoute] | None = None) -> FastAPI:
    app = FastAPIOffline(
        title="specrouter admin API",
        version="1",
        redoc_url=None,
        docs_url="/admin/docs",
        openapi_url="/admin/openapi.json",
        static_url="/admin/docs/static",
        swagger_ui_oauth2_redirect_url="/admin/docs/oauth2-redirect",
        # No call to the online validator: the docs work offline and send nothing out.
        swagger_ui_parameters={"validatorUrl": None},
        exception_handlers=_handlers(gw),
    )
    app.state.admin_auth = checker = AdminAuth(gw.settings)

    @app.get("/metrics", include_in_schema=False)
    async def metrics(request: Request) -> Response:
        if checker.scrape is not None:
            checker.identify(request, checker.scrape)
        return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", summary="Liveness of the admin listener")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    router = admin_router(gw)

    @router.get("/admin/status", summary="Engine state: per backend health and load")
    async def status() -> StatusOut:
        state = gw.live.snapshot()
        return StatusOut.model_validate(
            {
                "policy_version": gw.policy.current.version,
                "in_flight": len(gw.in_flight),
                "backends": {
                    name: {
                        "health": b.health,
                        "in_flight": b.in_flight,
                        "running": b.running,
                        "waiting": b.waiting,
                        "kv_usage": b.kv_usage,
                        "acceptance": b.acceptance,
                    }
                    for name, b in state.backends.items()
                },
                "events": gw.events.rows(),
            }
        )

    @router.get("/admin/readyz", summary="Readiness, per route (the public /readyz: only ready)")
    async def readyz(response: Response) -> ReadyOut:
        ready, routes = readiness(gw)
        response.status_code = 200 if ready else 503
        return ReadyOut(ready=ready, draining=gw.draining, routes=routes)

    app.include_router(router)
    app.router.routes.extend(extra_routes or [])
    _without_fastapi_422(app)
    return app


def _without_fastapi_422(app: FastAPI) -> None:
    """Drop the 422 FastAPI documents for every parameter: `invalid` above answers 400."""
    generate = app.openapi
    fastapi_422 = "#/components/schemas/HTTPValidationError"

    def openapi() -> dict[str, Any]:
        spec = generate()  # FastAPI caches it; the edit is idempotent
        for item in spec.get("paths", {}).values():
            for operation in item.values():
                responses = operation.get("responses", {})
                schema = (
                    responses.get("422", {})
                    .get("content", {})
                    .get("application/json", {})
                    .get("schema", {})
                )
                if schema.get("$ref") == fastapi_422:
                    del responses["422"]
        for name in ("HTTPValidationError", "ValidationError"):
            spec.get("components", {}).get("schemas", {}).pop(name, None)
        return spec

    app.openapi = openapi  # type: ignore[method-assign]
