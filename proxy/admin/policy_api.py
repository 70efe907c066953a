"""Admin API for the policy: read, validate, explain, apply (If-Match), history, rollback."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from policies.engine import decide
from policies.inputs import live_state_from_json, request_view
from policies.schema import PolicyError
from policies.types import Endpoint
from proxy.admin.app import guarded
from proxy.admin.policy_store import PolicyStore, StaleVersion
from proxy.gateway import Gateway
from proxy.relay.errors import error_body

_ENDPOINTS: dict[str, Endpoint] = {"chat": "chat", "completions": "completions",
                                   "embeddings": "embeddings", "responses": "responses"}


def _error(status: int, message: str, **extra: Any) -> Response:
    body = orjson.loads(error_body(status, message))
    body["error"].update(extra)
    return JSONResponse(body, status_code=status)


def _invalid(exc: PolicyError) -> Response:
    errors = [str(e) for e in getattr(exc, "errors", [str(exc)])]
    return _error(422, "invalid policy: " + "; ".join(errors), errors=errors)


def _etag(version: str) -> str:
    return f'"{version}"'


def _unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def _who(request: Request) -> str:
    return request.headers.get("x-specrouter-admin", "admin")


def policy_routes(gw: Gateway, store: PolicyStore) -> list[BaseRoute]:
    async def get_policy(request: Request) -> Response:
        policy = store.current
        headers = {"etag": _etag(policy.version), "x-policy-version": policy.version}
        if request.query_params.get("format") == "yaml":
            return Response(store.document_yaml(), media_type="application/yaml", headers=headers)
        return JSONResponse({"version": policy.version, "document": policy.document.to_data()},
                            headers=headers)

    async def put_policy(request: Request) -> Response:
        if_match = _unquote(request.headers.get("if-match"))
        if if_match is None:
            return _error(428, "If-Match is required: send the ETag of GET /admin/policy")
        text = await request.body()
        try:
            applied = await store.apply(text, who=_who(request), if_match=if_match)
        except PolicyError as exc:
            return _invalid(exc)
        except StaleVersion as exc:
            return _error(412, f"the policy changed meanwhile: current version is {exc}",
                          current_version=str(exc))
        return JSONResponse({"version": applied.version, "number": applied.number,
                             "changes": list(applied.changes)},
                            headers={"etag": _etag(applied.version)})

    async def validate(request: Request) -> Response:
        try:
            policy = store.validate(await request.body())
        except PolicyError as exc:
            return _invalid(exc)
        return JSONResponse({"valid": True, "version": policy.version})

    async def explain(request: Request) -> Response:
        try:
            data = orjson.loads(await request.body())
            if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
                raise ValueError("body must be {\"request\": {...}, \"state\"?: {...}, "
                                 "\"client\"?: NAME, \"endpoint\"?: chat|completions|...}")
            body = data["request"]
            endpoint = _ENDPOINTS[data.get("endpoint", "chat")]
            state = (live_state_from_json(data["state"]) if isinstance(data.get("state"), dict)
                     else gw.live.snapshot())
            policy = store.current
            client = str(data.get("client") or (policy.document.clients[0].name
                                                if policy.document.clients else "anonymous"))
            headers = {}
            if isinstance(data.get("pin"), str):
                headers[b"x-specrouter-variant"] = data["pin"].encode()
            view = request_view(body, endpoint, str(body.get("model", "")), client, headers,
                                float(data.get("now", time.monotonic())))
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, f"cannot explain: {exc}")
        decision = decide(view, state, policy, explain=True)
        out = asdict(decision)
        out["inject"] = dict(decision.inject)
        return JSONResponse({"policy_version": policy.version, "decision": out})

    async def history(_: Request) -> Response:
        return JSONResponse({"current": store.current.version, "history": store.history()})

    async def rollback(request: Request) -> Response:
        try:
            data = orjson.loads(await request.body())
            number = int(data["version"])
        except (ValueError, KeyError, TypeError):
            return _error(400, 'body must be {"version": N} (a number from the history)')
        try:
            applied = await store.rollback(number, who=_who(request),
                                           if_match=_unquote(request.headers.get("if-match")))
        except KeyError:
            return _error(404, f"no policy version #{number}")
        except PolicyError as exc:
            return _invalid(exc)
        except StaleVersion as exc:
            return _error(412, f"the policy changed meanwhile: current version is {exc}")
        return JSONResponse({"version": applied.version, "number": applied.number,
                             "changes": list(applied.changes)})

    return [
        Route("/admin/policy", guarded(gw, get_policy), methods=["GET"]),
        Route("/admin/policy", guarded(gw, put_policy), methods=["PUT"]),
        Route("/admin/policy/validate", guarded(gw, validate), methods=["POST"]),
        Route("/admin/policy/explain", guarded(gw, explain), methods=["POST"]),
        Route("/admin/policy/history", guarded(gw, history), methods=["GET"]),
        Route("/admin/policy/rollback", guarded(gw, rollback), methods=["POST"]),
    ]

