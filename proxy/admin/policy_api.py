"""Admin API for the policy: read, validate, explain, apply (If-Match), history, rollback.

Changes are conditional: `If-Match` carries the ETag of `GET /admin/policy` (or `*`, any current
version), and is checked before the body is read, so a stale change is answered 412 whatever its
body (RFC 9110 section 13.2.1). Each operation reads its own body, so the error bodies are the
gateway's, not FastAPI's validation errors.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

import orjson
from fastapi import Header, Query
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from policies.engine import decide
from policies.explain import session_from_row
from policies.inputs import live_state_from_json, request_view
from policies.loading import TOO_DEEP, dump_yaml
from policies.schema import PolicyError
from policies.sessions import SessionId, session_of
from policies.types import RuleVerdict, SessionView
from proxy.admin.app import AdminError, admin_router
from proxy.admin.models import (
    AppliedOut,
    ErrorOut,
    ExplainIn,
    ExplainOut,
    HistoryOut,
    PolicyIn,
    PolicyOut,
    RollbackIn,
    SessionOut,
    ValidOut,
)
from proxy.admin.policy_store import Applied, PolicyStore, StaleVersion
from proxy.admin.residency_view import admission_out
from proxy.gateway import Gateway

# The audit's "who" is the name of the admin token used; a header only adds a note.
# The largest explain body: a request, a state and a session row fit in far less.
EXPLAIN_MAX_BYTES = 1 << 20
_NOTE = Header(
    None,
    alias="x-specrouter-note",
    max_length=200,
    description="A note for the audit log (who made the change is the name of the "
    "admin token used).",
)
_IF_MATCH = Header(
    None,
    alias="if-match",
    description="The ETag of `GET /admin/policy`, or `*` for any current version.",
)


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    return {code: {"model": ErrorOut} for code in codes}


def _body(model: type[BaseModel], *types: str) -> dict[str, Any]:
    """The OpenAPI request body of an operation that reads (and checks) its body itself.
    Nested models are the app's components already (GET's PolicyOut brings them)."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    schema.pop("$defs", None)
    content: dict[str, Any] = {"application/json": {"schema": schema}}
    content.update({t: {"schema": {"type": "string"}} for t in types})
    return {"requestBody": {"required": True, "content": content}}


def _invalid(exc: PolicyError) -> AdminError:
    errors = [str(e) for e in getattr(exc, "errors", [str(exc)])]
    return AdminError(422, "invalid policy: " + "; ".join(errors), errors=errors)


def _stale(exc: StaleVersion) -> AdminError:
    return AdminError(
        412, f"the policy changed meanwhile: current version is {exc}", current_version=str(exc)
    )


def _etag(version: str) -> str:
    return f'"{version}"'


def _unquote(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if value.startswith("W/"):
        value = value[2:]
    return value.strip('"')


def _precondition(store: PolicyStore, if_match: str | None) -> str:
    """The version a change is based on, checked before its body is read: 428 or 412."""
    version = _unquote(if_match)
    if version is None:
        raise AdminError(428, "If-Match is required: send the ETag of GET /admin/policy")
    try:
        store.check(version)
    except StaleVersion as exc:
        raise _stale(exc) from None
    return version


def _document(text: bytes) -> bytes:
    """The policy in a PUT or validate body: the document (YAML or JSON) or GET's JSON body,
    `{"version", "document"}`, sent back as it came (its `version` is If-Match's to carry)."""
    if not text.lstrip().startswith(b"{"):
        return text
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text  # validation says what is wrong with it
    if isinstance(data, dict) and data.keys() == {"version", "document"}:
        try:
            return dump_yaml(data["document"]).encode()
        except RecursionError:
            raise PolicyError([TOO_DEEP]) from None
    return text


async def _read_bounded(request: Request, limit: int) -> bytes | None:
    """The body, read no further than `limit` bytes; None past it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


async def _read_document(request: Request, store: PolicyStore) -> bytes:
    """The body of a PUT or validate, read no further than the document limit (422 past it),
    then turned into the document off the event loop."""
    limit = store.limits.max_bytes
    body = await _read_bounded(request, limit)
    if body is None:
        raise _invalid(PolicyError([f"the document is more than the limit of {limit} bytes"]))
    try:
        return await asyncio.to_thread(_document, body)
    except PolicyError as exc:
        raise _invalid(exc) from None


def _applied(applied: Applied, response: Response) -> AppliedOut:
    response.headers["etag"] = _etag(applied.version)
    return AppliedOut(version=applied.version, number=applied.number, changes=list(applied.changes))


_AS_YAML: dict[int | str, dict[str, Any]] = {
    200: {
        "content": {"application/yaml": {"schema": {"type": "string"}}},
        "description": "The running policy; the `ETag` header is its version, unquoted in `version`.",
    }
}


def policy_routes(gw: Gateway, store: PolicyStore) -> list[BaseRoute]:
    router = admin_router(gw)

    @router.get(
        "/admin/policy",
        summary="The running policy (JSON, or `?format=yaml`)",
        responses=_AS_YAML,
        response_model=PolicyOut,
    )
    async def get_policy(response: Response, fmt: str | None = Query(None, alias="format")) -> Any:
        policy = store.current
        headers = {"etag": _etag(policy.version), "x-policy-version": policy.version}
        if fmt == "yaml":
            return Response(store.document_yaml(), media_type="application/yaml", headers=headers)
        response.headers.update(headers)
        return PolicyOut(version=policy.version, document=policy.document)

    @router.put(
        "/admin/policy",
        summary="Apply a policy (If-Match required)",
        responses=_errors(400, 412, 422, 428),
        openapi_extra=_body(PolicyIn, "application/yaml"),
    )
    async def put_policy(
        request: Request,
        response: Response,
        if_match: str | None = _IF_MATCH,
        note: str | None = _NOTE,
    ) -> AppliedOut:
        version = _precondition(store, if_match)
        try:
            applied = await store.apply(
                await _read_document(request, store),
                who=request.state.admin,
                if_match=version,
                note=note or "",
            )
        except PolicyError as exc:
            raise _invalid(exc) from None
        except StaleVersion as exc:
            raise _stale(exc) from None
        return _applied(applied, response)

    @router.post(
        "/admin/policy/validate",
        summary="Check a policy without applying it",
        responses=_errors(422),
        openapi_extra=_body(PolicyIn, "application/yaml"),
    )
    async def validate(request: Request) -> ValidOut:
        try:
            policy = await store.validate(await _read_document(request, store))
        except PolicyError as exc:
            raise _invalid(exc) from None
        return ValidOut(valid=True, version=policy.version)

    @router.post(
        "/admin/policy/explain",
        summary="What the policy decides for a request, and why",
        responses=_errors(400),
        openapi_extra=_body(ExplainIn),
    )
    async def explain(request: Request) -> ExplainOut:
        # Bounded as a policy document is, and parsed off the loop (50 MB once stalled it).
        raw = await _read_bounded(request, EXPLAIN_MAX_BYTES)
        if raw is None:
            raise AdminError(
                413, f"cannot explain: the body is more than {EXPLAIN_MAX_BYTES} bytes"
            )
        try:
            data = await asyncio.to_thread(ExplainIn.model_validate_json, raw)
            body = data.request
            state = (
                live_state_from_json(data.state) if data.state is not None else gw.live.snapshot()
            )
            policy = store.current
            client = data.client or (
                policy.document.clients[0].name if policy.document.clients else "anonymous"
            )
            headers = {k.lower().encode(): v.encode() for k, v in (data.headers or {}).items()}
            if data.pin is not None:
                headers[b"x-specrouter-variant"] = data.pin.encode()
            # The table's clock (the relay's too), so a live row's idle time counts as there.
            now = time.perf_counter() if data.now is None else data.now
            session, source = _session_input(gw, data, client, headers, now)
            view = request_view(
                body, data.endpoint, str(body.get("model", "")), client, headers, now, session
            )
        except ValidationError as exc:
            raise AdminError(
                400,
                'cannot explain: body must be {"request": {...}, '
                '"state"?: {...}, "client"?: NAME, "endpoint"?: '
                f"chat|completions|...}}: {_first(exc)}",
            ) from None
        except (ValueError, KeyError, TypeError) as exc:
            raise AdminError(400, f"cannot explain: {exc}") from None
        decision = decide(view, state, policy, explain=True)
        try:
            admission = admission_out(gw, data.residency, view, decision, policy, body)
        except (ValueError, TypeError) as exc:
            raise AdminError(400, f"cannot explain: residency: {exc}") from None
        out = asdict(decision)
        out["inject"] = dict(decision.inject)
        return ExplainOut(
            policy_version=policy.version,
            decision=out,
            session=_session_out(view.session, source, decision.verdicts, gw),
            admission=admission,
        )

    @router.get("/admin/policy/history", summary="Every applied version: who, when, what changed")
    async def history() -> HistoryOut:
        return HistoryOut.model_validate(
            {"current": store.current.version, "history": store.history()}
        )

    @router.post(
        "/admin/policy/rollback",
        summary="Apply a version from the history again (If-Match required)",
        responses=_errors(400, 404, 412, 422, 428),
        openapi_extra=_body(RollbackIn),
    )
    async def rollback(
        request: Request, response: Response, if_match: str | None = _IF_MATCH
    ) -> AppliedOut:
        version = _precondition(store, if_match)
        try:
            number = RollbackIn.model_validate_json(await request.body()).version
        except ValidationError:
            raise AdminError(
                400, 'body must be {"version": N} (a number from the history)'
            ) from None
        try:
            applied = await store.rollback(number, who=request.state.admin, if_match=version)
        except KeyError:
            raise AdminError(404, f"no policy version #{number}") from None
        except PolicyError as exc:
            raise _invalid(exc) from None
        except StaleVersion as exc:
            raise _stale(exc) from None
        return _applied(applied, response)

    return list(router.routes)


def _session_input(
    gw: Gateway, data: ExplainIn, client: str, headers: dict[bytes, bytes], now: float
) -> tuple[SessionView | None, str]:
    """(the session to explain with, where it came from): a row given by hand, a key of the
    live table, or the request's own session (headers, `user`, fingerprint) looked up there,
    as the relay does (proxy/relay/app.py)."""
    if isinstance(data.session, dict):
        sid = session_of(client, data.request, headers)
        return session_from_row("s-explain" if sid is None else sid.key, data.session), "given"
    if isinstance(data.session, str):
        row = gw.sessions.get(data.session)
        subagent = row is not None and row.subagent
        sid = SessionId(data.session, "header", "", subagent)
    elif data.endpoint == "embeddings":
        return None, "new"
    else:
        found = session_of(client, data.request, headers)
        if found is None:
            return None, "new"
        sid = found
    view = gw.sessions.view(sid, now)
    return view, "new" if view.engine is None else "table"


def _session_out(
    session: SessionView | None, source: str, verdicts: tuple[RuleVerdict, ...], gw: Gateway
) -> SessionOut | None:
    if session is None:
        return None
    verdict = next((v for v in verdicts if v.rule == "session"), None)
    row = gw.sessions.get(session.key) if source == "table" else None
    resident = None if row is None else gw.kv_resident_tokens(row.engine, session.key)
    return SessionOut(
        key=session.key,
        source=source,
        engine=session.engine,
        prefix_tokens=session.prefix_tokens,
        turns=session.turns,
        out_tokens_per_turn=session.out_tokens_per_turn,
        mean_turns=session.mean_turns,
        subagent=session.subagent,
        attained_tokens=session.attained_tokens,
        verdict=None if verdict is None else verdict.verdict,
        detail="" if verdict is None else verdict.detail,
        lost_tokens=0 if row is None else row.lost_tokens,
        loss_cause="" if row is None else row.loss_cause,
        loss_where="" if row is None else row.loss_where,
        resident_tokens=resident,
    )


def _first(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else str(err["msg"])
