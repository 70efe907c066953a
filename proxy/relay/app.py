"""The public listener: the OpenAI-compatible API, as a plain ASGI app.

No framework on this path: each request is a handful of dict lookups, one orjson parse, the
policy decision and the relay. The admin surface lives on its own listener (proxy/admin/app.py).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import orjson

from policies.agent_signals import signals_of
from policies.engine import RETRY_AFTER_UNAVAILABLE_S, decide
from policies.inputs import for_body, request_view
from policies.sessions import session_of
from policies.types import Endpoint
from proxy import auth
from proxy.body_budget import BodyBudget, BodyLease
from proxy.bounds import finite_number, kept_name
from proxy.record.request import RequestRecord
from proxy.relay import owned, required
from proxy.relay.asgi import Receive, Send, lifespan, respond, respond_error
from proxy.relay.body_shape import Encoded
from proxy.relay.channel import PushChannel
from proxy.relay.context import Services
from proxy.relay.errors import error_body
from proxy.relay.exchange import Decided, EngineLink, Exchange
from proxy.relay.fields import Limits, check_fields, too_many_containers
from proxy.relay.forward import ENDPOINTS, forward
from proxy.relay.models_list import model_list
from proxy.relay.openapi import spec_bytes
from proxy.relay.pull import PULL
from proxy.relay.push import PUSH
from proxy.relay.ready import readiness
from proxy.relay.turnstate import HEADER as TURN_STATE
from proxy.relay.watch import DisconnectWatch
from proxy.throttle import AuthThrottle, source_of

if TYPE_CHECKING:
    from policies.schema import ClientSpec

_GET_PATHS = frozenset({"/v1/models", "/openapi.json", "/healthz", "/readyz"})


_RETRY = ((b"retry-after", b"1"), (b"x-should-retry", b"true"))


class BodyTooLarge(Exception):
    pass


def _declared(headers: dict[bytes, bytes], limit: int) -> int:
    """The body's declared length, or `limit` when none is declared (or a larger one: it gets
    413 once that much arrived)."""
    value = headers.get(b"content-length", b"")
    return int(value) if value.isdigit() and int(value) <= limit else limit


async def read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionResetError("client gone while sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


class PublicApp:
    def __init__(self, gw: Services) -> None:
        self.gw = gw
        self.throttle = AuthThrottle(gw.settings.auth_failures_per_minute, listener="public")
        self.limits = Limits.of(gw.settings)
        s = gw.settings
        self.bodies = BodyBudget(s.body_budget_bytes, s.body_budget_per_client_bytes)
        self.clients: auth.Clients[ClientSpec] = auth.Clients()

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if method != "POST":
                message = f"{method} is not allowed on {path}"  # Messages' in its own shape
                body = error_body(405, message, anthropic=endpoint == "messages")
                await respond(send, 405, body, [(b"allow", b"POST")])
                return
            await self.generate(scope, receive, send, endpoint)
        elif path in _GET_PATHS:
            if method not in ("GET", "HEAD"):
                await respond_error(
                    send,
                    405,
                    f"{method} is not allowed on {path}",
                    headers=[(b"allow", b"GET, HEAD")],
                )
            elif path == "/v1/models":
                await self.models(scope, send)
            elif path == "/openapi.json":
                await respond(send, 200, spec_bytes())
            elif path == "/healthz":
                await respond(send, 200, b'{"status":"ok"}')
            else:
                await self.readyz(send)
        elif path.startswith("/v1/models/") and method in ("GET", "HEAD"):
            # The SDKs' models.retrieve(id); model ids may hold a slash.
            await self.models(scope, send, path[len("/v1/models/") :])
        else:
            message = f"no route for {method} {path}"
            anthropic = path.startswith("/v1/messages")
            await respond(send, 404, error_body(404, message, anthropic=anthropic))

    def _client(self, scope: dict[str, Any], headers: dict[bytes, bytes], policy: Any) -> Any:
        """The policy's client of the request's key (`Authorization: Bearer` or `x-api-key`),
        or None; a wrong key counts as a failure of its source (proxy/throttle.py)."""
        client = self.clients.find(
            policy,
            policy.client_by_key_hash,
            headers.get(b"authorization"),
            headers.get(b"x-api-key"),
        )
        if client is None and (b"authorization" in headers or b"x-api-key" in headers):
            self.throttle.failed(source_of(scope))
        elif client is not None:  # the connection may idle as long as any (proxy/servers.py)
            scope.get("extensions", {}).get("specrouter.authenticated", _nothing)()
        return client

    async def _throttled(
        self,
        scope: dict[str, Any],
        send: Send,
        headers: list[tuple[bytes, bytes]],
        *,
        anthropic: bool = False,
    ) -> bool:
        """Answered 429 (before any key is checked): the source failed too often."""
        wait = self.throttle.retry_after(source_of(scope))
        if wait is None:
            return False
        await respond(
            send,
            429,
            error_body(
                429,
                f"too many failed authentications from this address: retry in {wait}s",
                type_="RateLimitError",
                anthropic=anthropic,
            ),
            [*headers, (b"retry-after", str(wait).encode())],
        )
        return True

    async def models(self, scope: dict[str, Any], send: Send, model_id: str | None = None) -> None:
        if await self._throttled(scope, send, []):
            return
        if self._client(scope, dict(scope["headers"]), self.gw.policy.current) is None:
            await _unauthorized(send)
            return
        gw = self.gw
        listed = model_list(gw.policy.current, gw.engine_table, gw.settings, int(time.time()))
        if model_id is None:
            await respond(send, 200, orjson.dumps(listed))
            return
        match = next((m for m in listed["data"] if m["id"] == model_id), None)
        if match is None:
            await respond_error(
                send,
                404,
                f"The model `{model_id}` does not exist.",
                type_="NotFoundError",
                param="model",
            )
            return
        await respond(send, 200, orjson.dumps(match))

    async def readyz(self, send: Send) -> None:
        # Ready or not, nothing more: route names are the admin listener's (/admin/readyz).
        ready, _ = readiness(self.gw)
        await respond(send, 200 if ready else 503, orjson.dumps({"ready": ready}))

    async def generate(
        self, scope: dict[str, Any], receive: Receive, send: Send, endpoint: Endpoint
    ) -> None:
        gw = self.gw
        x: Exchange[Any] = Exchange(gw, scope, send, endpoint)
        if await self._throttled(scope, x.send, x.arrival.rid, anthropic=x.arrival.anthropic):
            return
        client = self._client(scope, x.arrival.headers, x.arrival.policy)
        if client is None:
            await _unauthorized(x.send, x.arrival.rid, anthropic=x.arrival.anthropic)
            return
        if client.max_concurrent is None and client.requests_per_minute is None:
            await self._budgeted(x, client, scope, receive)
            return
        wait = await gw.limits.enter(client.name, client.max_concurrent, client.requests_per_minute)
        if wait is not None:
            gw.metrics.rate_limited.labels(client.name).inc()
            await x.error(
                429,
                f"rate limit for client {client.name!r}: retry in {wait:.1f}s",
                type_="RateLimitError",
                headers=[*x.arrival.rid, (b"retry-after", str(max(1, round(wait))).encode())],
            )
            return
        try:
            await self._budgeted(x, client, scope, receive)
        finally:
            await gw.limits.leave(client.name)

    async def _budgeted(
        self, x: Exchange[Any], client: ClientSpec, scope: dict[str, Any], receive: Receive
    ) -> None:
        """The request, its body's bytes taken from the process's and its client's budget
        (proxy/body_budget.py) from before it is read until the request ends."""
        settings = self.gw.settings
        declared = _declared(x.arrival.headers, settings.max_body_bytes)
        lease = await self.bodies.take(client.name, declared, settings.body_budget_wait_s)
        if lease is None:
            await x.error(
                503,
                "request bodies in flight fill this gateway's memory budget; retry",
                headers=[*x.arrival.rid, *_RETRY, (b"connection", b"close")],
            )
            return
        try:
            await self._generate(x, client, scope, receive, lease)
        finally:
            lease.release()

    async def _generate(
        self,
        x: Exchange[Any],
        client: ClientSpec,
        scope: dict[str, Any],
        receive: Receive,
        lease: BodyLease,
    ) -> None:
        raw = await self._read(x, receive)
        if raw is None:
            return
        lease.fit(len(raw))
        # From the parse to the decision, no await: the body's containers are made and, once
        # decided, freed (`release_tree`), without the collector walking them meanwhile (~0.3
        # ms of an agent's 400 KiB body). An answer to send is sent after, collector on.
        # Inline, not a context manager: a generator's enter and exit cost ~10 us cold.
        collecting = gc.isenabled()
        gc.disable()
        try:
            answer = self._parse(x, client, raw) or self._decide(x, client, len(raw))
        finally:
            if collecting:
                gc.enable()
        del raw  # held no longer than its parse
        if answer is not None:
            await answer
            return
        gw, rid = self.gw, x.arrival.rid
        if gw.draining:
            await x.error(
                503,
                "the gateway is shutting down; retry",
                headers=[*rid, (b"retry-after", b"1"), (b"connection", b"close")],
            )
            return
        channel: PushChannel | None = scope.get("extensions", {}).get("specrouter.push")
        watch = DisconnectWatch(receive, channel)
        gw.watches[id(x.decided.record)] = watch
        # Push or pull, chosen here once: our server's channel carries event streams.
        if (
            x.body.get("stream") is True
            and x.arrival.endpoint != "embeddings"
            and gw.settings.relay == "push"
            and channel is not None
        ):
            x.engine = EngineLink(PUSH, channel, watch)
        else:
            x.engine = EngineLink(PULL, None, watch)
        try:
            await forward(x)
        finally:
            watch.stop()
            gw.watches.pop(id(x.decided.record), None)
            if channel is not None:  # our server: a response left unfinished ends here
                channel.end_unfinished()

    async def _read(self, x: Exchange[Any], receive: Receive) -> bytes | None:
        """The body's bytes; None once answered."""
        settings, rid = self.gw.settings, x.arrival.rid
        try:
            if _arrived(receive):  # most: the body came with the head; no timer to arm
                raw = await read_body(receive, settings.max_body_bytes)
            else:
                async with asyncio.timeout(settings.body_timeout_s):
                    raw = await read_body(receive, settings.max_body_bytes)
        except TimeoutError:
            await x.error(
                408,
                f"request body not received within {settings.body_timeout_s:g}s",
                headers=[*rid, (b"connection", b"close")],
            )
            return None
        except BodyTooLarge:
            await x.error(
                413, f"request body larger than {settings.max_body_bytes} bytes", headers=rid
            )
            return None
        except ConnectionResetError:
            return None
        return raw

    def _parse(
        self, x: Exchange[Any], client: ClientSpec, raw: bytes
    ) -> Coroutine[Any, Any, None] | None:
        """The body, parsed and checked (`x.body`, `x.encoded`); else the answer to send."""
        rid = x.arrival.rid
        crowded = too_many_containers(raw, self.limits)
        if crowded is not None:
            return x.error(413, crowded, headers=rid)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return x.error(400, f"request body is not valid JSON: {exc}", headers=rid)
        encoded: Encoded = {}
        problem = (
            check_fields(x.arrival.endpoint, body, self.limits, encoded, len(raw))
            or required.missing(x.arrival.path, body)
            or owned.refused(body)
        )
        if problem is not None:
            return x.error(400, problem[0], param=problem[1], headers=rid)
        previous = body.get("previous_response_id") if x.arrival.endpoint == "responses" else None
        if isinstance(previous, str) and self.gw.response_owners.owner(previous) not in (
            None,
            client.name,
        ):  # another client's conversation: answered as vLLM answers an unknown id
            return x.error(
                404,
                f"Response with id '{previous[:128]}' not found.",
                param="previous_response_id",
                headers=rid,
            )
        x.body, x.encoded = body, encoded
        return None

    def _decide(
        self, x: Exchange[Any], client: ClientSpec, body_bytes: int
    ) -> Coroutine[Any, Any, None] | None:
        """The policy's decision (`x.decided`); else the answer to send (a rejection)."""
        gw, arrival, body = self.gw, x.arrival, x.body
        policy, rid, model = arrival.policy, arrival.rid, body["model"]
        record = RequestRecord(
            request_id=arrival.request_id,
            client=client.name,
            endpoint=arrival.endpoint,
            stream=body.get("stream") is True,
        )
        record.m.t_start, record.model = arrival.t0, kept_name(model)  # kept: bounded
        if gw.begin is not None:
            gw.begin(record, arrival.headers)
        sid = (
            session_of(client.name, body, arrival.headers)
            if arrival.endpoint != "embeddings"
            else None
        )
        table = gw.sessions
        session = None
        turn_engine = None
        if arrival.endpoint != "embeddings":  # what the agent says of its request, bounded
            record.signals = signals_of(client.name, arrival.headers)
        if sid is not None:
            table.configure(
                policy.sessions.table_size,
                policy.sessions.idle_s,
                policy.document.fairness.window_s,
            )
            session = table.view(sid, arrival.t0)
            record.session, record.subagent = sid.key, sid.subagent
            record.agent = sid.kind + "/subagent" if sid.subagent else sid.kind
            record.prefix_check = gw.prefixes.check(sid.key, arrival.endpoint, body, x.encoded)
            token = arrival.headers.get(TURN_STATE)
            if token is not None:  # Codex echoes it within a turn (proxy/relay/turnstate.py)
                turn_engine = gw.turn_state.verify(token, client.name, sid.key, time.time())
                route = policy.route_for_model(model)
                if route is None or turn_engine not in route.variants:
                    turn_engine = None  # one the route no longer has: refused, not `valid`
                record.turn_state = "refused" if turn_engine is None else "valid"
        keeps = record.signals.keeps_place
        view = request_view(
            body,
            arrival.endpoint,
            model,
            client.name,
            arrival.headers,
            arrival.t0,
            session,
            identified=True,
            keeps_place=keeps,
            turn_engine=turn_engine,
            request_class=record.signals.request_class,
            every_signal=False,  # the class is all the decision reads of them
        )
        decision = for_body(decide(view, gw.live.snapshot(), policy), arrival.endpoint, body)
        # A compaction or auxiliary request never places nor moves its session.
        if sid is not None and decision.backend is not None and not keeps:
            table.placed(sid, client.name, decision.backend, arrival.t0)
        record.route, record.reason = decision.route, decision.reason
        record.policy_version = policy.version
        record.content_class, record.canary = decision.content_class, decision.canary
        if decision.rejection is not None or decision.backend is None:
            record.outcome = "rejected"
            record.status = decision.rejection.status if decision.rejection else 503
            return self._rejected(x, record, decision)
        record.defaults_applied = decision.defaults_applied
        temperature = decision.inject.get("temperature", body.get("temperature"))
        record.temperature = finite_number(temperature)  # stored: bounded (proxy/bounds.py)
        record.temperature_defaulted = "temperature" in decision.defaults_applied
        record.decided = decision.backend

        extra = list(rid)
        if decision.defaults_applied:
            applied = ",".join(f"{k}={_fmt(decision.inject[k])}" for k in decision.defaults_applied)
            extra.append((b"x-specrouter-defaults", applied.encode()))
        affinity, adaptable = x.release_tree()
        x.decided = Decided(model, body_bytes, record, decision, extra, affinity, adaptable)
        return None

    async def _rejected(self, x: Exchange[Any], record: RequestRecord, decision: Any) -> None:
        rej, rid, gw = decision.rejection, x.arrival.rid, self.gw
        if rej is not None:
            retry = []
            if rej.status in (429, 503):
                retry = [(b"retry-after", str(int(rej.retry_after_s or 5)).encode())]
            await x.error(
                rej.status, rej.message, param=rej.param, type_=rej.type, headers=[*rid, *retry]
            )
        else:
            wait = str(int(RETRY_AFTER_UNAVAILABLE_S)).encode()
            await x.error(503, "no backend available", headers=[*rid, (b"retry-after", wait)])
        record.m.t_end = time.perf_counter()
        gw.metrics.observe_request(
            record.route or "none", "none", record.client, record.outcome, record.m
        )
        gw.finished(record)


def _arrived(receive: Receive) -> bool:
    """Whether the whole body is in already, so `receive` returns without waiting: uvicorn's
    request cycle sets `more_body` False once the body's last byte arrived (pinned by
    tests/test_uvicorn_contract.py); another server's `receive` says nothing, and is timed."""
    return getattr(getattr(receive, "__self__", None), "more_body", True) is False


def _nothing() -> None:
    pass


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


async def _unauthorized(
    send: Send, headers: list[tuple[bytes, bytes]] | None = None, *, anthropic: bool = False
) -> None:
    await respond(
        send,
        401,
        error_body(
            401,
            "invalid or missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY` "
            "(one key, not two different ones)",
            type_="AuthenticationError",
            code="invalid_api_key",
            anthropic=anthropic,
        ),
        [*(headers or []), (b"www-authenticate", b"Bearer")],
    )
