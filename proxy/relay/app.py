"""The public listener: the OpenAI-compatible API, as a plain ASGI app.

No framework on this path: each request is a handful of dict lookups, one orjson parse, the
policy decision and the relay. The admin surface lives on its own listener (proxy/admin/app.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import orjson

from policies.engine import decide
from policies.inputs import request_view
from policies.types import Endpoint
from proxy import auth
from proxy.backends.admission import AdmissionTimeout
from proxy.backends.endpoints import prefix_affinity
from proxy.gateway import Gateway, RequestRecord
from proxy.relay.continuation import ContinuableFilter, can_continue, continuation_body
from proxy.relay.engine_conn import EngineStream, open_engine_stream
from proxy.relay.errors import error_body
from proxy.relay.measure import StreamFilter
from proxy.relay.openapi import spec_bytes
from proxy.relay.pull import (
    CHAT_ENDS,
    RESPONSES_ENDS,
    DisconnectWatch,
    Receive,
    Resume,
    Send,
    first_chunk,
    relay_body,
    relay_sse,
)
from proxy.relay.push import PushChannel, relay_body_push, relay_sse_push
from proxy.relay.rewrite import plan_usage, upstream_body
from proxy.relay.upstream import RESPONSE_DROP, UpstreamError

ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
_GET_PATHS = frozenset({"/v1/models", "/openapi.json", "/healthz", "/readyz"})
_JSON = [(b"content-type", b"application/json")]


async def respond(send: Send, status: int, body: bytes,
                  headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*_JSON, *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def respond_error(send: Send, status: int, message: str, *, param: str | None = None,
                        type_: str | None = None, headers: list[tuple[bytes, bytes]] | None = None,
                        code: int | str | None = None) -> None:
    await respond(send, status, error_body(status, message, param=param, type_=type_, code=code),
                  headers)


class BodyTooLarge(Exception):
    pass


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
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        endpoint = ENDPOINTS.get(path)
        if endpoint is not None:
            if method != "POST":
                await respond_error(send, 405, f"{method} is not allowed on {path}",
                                    headers=[(b"allow", b"POST")])
                return
            await self.generate(scope, receive, send, endpoint)
        elif path in _GET_PATHS:
            if method not in ("GET", "HEAD"):
                await respond_error(send, 405, f"{method} is not allowed on {path}",
                                    headers=[(b"allow", b"GET, HEAD")])
            elif path == "/v1/models":
                await self.models(scope, send)
            elif path == "/openapi.json":
                await respond(send, 200, spec_bytes())
            elif path == "/healthz":
                await respond(send, 200, b'{"status":"ok"}')
            else:
                await self.readyz(send)
        else:
            await respond_error(send, 404, f"no route for {method} {path}")

    def _client(self, scope: dict[str, Any]) -> Any:
        policy = self.gw.policy.current
        authz = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                authz = value
                break
        token = auth.bearer(authz)
        if token is None:
            return None
        return policy.client_by_key_hash(auth.hash_key(token))

    async def models(self, scope: dict[str, Any], send: Send) -> None:
        if self._client(scope) is None:
            await _unauthorized(send)
            return
        created = int(time.time())
        data: list[dict[str, Any]] = [{"id": name, "object": "model", "created": created, "owned_by": "specrouter",
                 "root": name, "parent": None, "max_model_len": None, "permission": []}
                for name in self.gw.policy.current.model_names()]
        await respond(send, 200, orjson.dumps({"object": "list", "data": data}))

    async def readyz(self, send: Send) -> None:
        policy = self.gw.policy.current
        state = self.gw.live.snapshot()
        routes: dict[str, bool] = {}
        for name, route in policy.document.routes.items():
            routes[name] = any(state.backends.get(b) is None or state.backends[b].health == "up"
                               for b in route.variants)
        ready = all(routes.values()) and not self.gw.draining
        await respond(send, 200 if ready else 503,
                      orjson.dumps({"ready": ready, "routes": routes}))

    async def generate(self, scope: dict[str, Any], receive: Receive, send: Send,
                       endpoint: Endpoint) -> None:
        gw = self.gw
        t0 = time.perf_counter()
        policy = gw.policy.current  # this request's policy, whatever is applied meanwhile
        headers = dict(scope["headers"])
        request_id = (headers.get(b"x-request-id") or uuid.uuid4().hex.encode()).decode("latin-1")
        rid = [(b"x-request-id", request_id.encode("latin-1"))]

        token = auth.bearer(headers.get(b"authorization"))
        client = None if token is None else policy.client_by_key_hash(auth.hash_key(token))
        if client is None:
            await _unauthorized(send, rid)
            return
        if client.max_concurrent is None and client.requests_per_minute is None:
            await self._generate(scope, receive, send, endpoint, t0, policy, headers,
                                 request_id, rid, client)
            return
        wait = await gw.limits.enter(client.name, client.max_concurrent,
                                     client.requests_per_minute)
        if wait is not None:
            gw.metrics.rate_limited.labels(client.name).inc()
            await respond_error(send, 429, f"rate limit for client {client.name!r}: retry in "
                                f"{wait:.1f}s", type_="RateLimitError",
                                headers=[*rid, (b"retry-after", str(max(1, round(wait))).encode())])
            return
        try:
            await self._generate(scope, receive, send, endpoint, t0, policy, headers,
                                 request_id, rid, client)
        finally:
            await gw.limits.leave(client.name)

    async def _generate(self, scope: dict[str, Any], receive: Receive, send: Send,
                        endpoint: Endpoint, t0: float, policy: Any,
                        headers: dict[bytes, bytes], request_id: str,
                        rid: list[tuple[bytes, bytes]], client: Any) -> None:
        gw = self.gw
        try:
            async with asyncio.timeout(gw.settings.body_timeout_s):
                raw = await read_body(receive, gw.settings.max_body_bytes)
        except TimeoutError:
            await respond_error(send, 408, f"request body not received within "
                                f"{gw.settings.body_timeout_s:g}s",
                                headers=[*rid, (b"connection", b"close")])
            return
        except BodyTooLarge:
            await respond_error(send, 413, f"request body larger than "
                                f"{gw.settings.max_body_bytes} bytes", headers=rid)
            return
        except ConnectionResetError:
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            await respond_error(send, 400, f"request body is not valid JSON: {exc}", headers=rid)
            return
        if not isinstance(body, dict):
            await respond_error(send, 400, "request body must be a JSON object", headers=rid)
            return
        model = body.get("model")
        if not isinstance(model, str) or not model:
            await respond_error(send, 400, "`model` is required and must be a string",
                                param="model", headers=rid)
            return

        record = RequestRecord(request_id=request_id, client=client.name, endpoint=endpoint,
                               stream=body.get("stream") is True)
        record.m.t_start = t0
        view = request_view(body, endpoint, model, client.name, headers, t0)
        decision = decide(view, gw.live.snapshot(), policy)
        record.route, record.reason = decision.route, decision.reason
        record.policy_version = policy.version
        record.content_class, record.canary = decision.content_class, decision.canary
        if decision.rejection is not None or decision.backend is None:
            rej = decision.rejection
            record.outcome, record.status = "rejected", rej.status if rej else 503
            if rej is not None:
                retry = []
                if rej.status in (429, 503):
                    retry = [(b"retry-after", str(int(rej.retry_after_s or 5)).encode())]
                await respond_error(send, rej.status, rej.message, param=rej.param,
                                    type_=rej.type, headers=[*rid, *retry])
            else:
                await respond_error(send, 503, "no backend available", headers=rid)
            record.m.t_end = time.perf_counter()
            gw.metrics.observe_request(record.route or "none", "none", record.client,
                                       record.outcome, record.m)
            gw.finished(record)
            return
        record.defaults_applied = decision.defaults_applied
        temperature = decision.inject.get("temperature", body.get("temperature"))
        record.temperature = temperature if isinstance(temperature, int | float) else None
        record.temperature_defaulted = "temperature" in decision.defaults_applied
        gw.metrics.decisions.labels(decision.route, decision.backend, decision.reason).inc()
        for name in decision.defaults_applied:
            gw.metrics.defaults_applied.labels(decision.route, name).inc()

        extra = list(rid)
        if decision.defaults_applied:
            applied = ",".join(f"{k}={_fmt(decision.inject[k])}" for k in decision.defaults_applied)
            extra.append((b"x-specrouter-defaults", applied.encode()))

        if gw.draining:
            await respond_error(send, 503, "the gateway is shutting down; retry",
                                headers=[*rid, (b"retry-after", b"1"), (b"connection", b"close")])
            return
        channel: PushChannel | None = scope.get("extensions", {}).get("specrouter.push")
        watch = DisconnectWatch(receive, channel)
        gw.watches[id(record)] = watch
        push: PushChannel | None = None
        if body.get("stream") is True and endpoint != "embeddings" and gw.settings.relay == "push":
            push = channel
        try:
            await self._forward(policy, send, watch, body, endpoint, model, decision, record,
                                extra, headers, push)
        finally:
            watch.stop()
            gw.watches.pop(id(record), None)

    async def _forward(self, policy: Any, send: Send, watch: DisconnectWatch,
                       body: dict[str, Any], endpoint: Endpoint, model: str, decision: Any,
                       record: RequestRecord, extra: list[tuple[bytes, bytes]],
                       headers: dict[bytes, bytes], push: PushChannel | None) -> None:
        gw = self.gw
        attempts = [decision.backend, *decision.fallbacks]
        last_error: UpstreamError | None = None
        resp: aiohttp.ClientResponse | EngineStream | None = None
        first = b""
        lease: Lease | None = None
        gw.in_flight[id(record)] = record
        try:
            for i, backend_name in enumerate(attempts):
                if watch.gone:
                    break
                backend = policy.backend(backend_name)
                urls = backend.endpoints
                base = urls[0] if len(urls) == 1 else gw.endpoints.pick(
                    urls, prefix_affinity(body))
                record.backend = backend_name
                if not gw.admission.try_acquire(backend_name, backend.max_concurrency):
                    try:
                        gw.metrics.queued.labels(backend_name).inc()
                        watch.pending = asyncio.ensure_future(gw.admission.acquire(
                            backend_name, backend.max_concurrency, record.client,
                            policy.document.admission.queue_timeout_s))
                        await watch.pending
                    except AdmissionTimeout as exc:
                        record.outcome, record.status = "rejected", 503
                        await respond_error(send, 503, f"backend busy: {exc}",
                                            headers=[*extra, (b"retry-after", b"2")])
                        return
                    except asyncio.CancelledError:
                        if not watch.gone:
                            raise
                        break
                    finally:
                        gw.metrics.queued.labels(backend_name).dec()
                lease = Lease.begin(gw, record, backend_name, base, backend.max_concurrency)
                try:
                    resp, first = await self._open(policy, watch, body, endpoint, decision,
                                                   record, headers, backend, base,
                                                   check_status=i + 1 < len(attempts),
                                                   push=push)
                    gw.live.success(backend_name)
                    break
                except asyncio.CancelledError:
                    if not watch.gone:
                        raise
                    break
                except UpstreamError as exc:
                    last_error = exc
                    gw.metrics.upstream_errors.labels(backend_name, exc.kind).inc()
                    if exc.kind == "connect" and exc.status is None and len(urls) == 1:
                        gw.live.down_now(backend_name)
                    else:
                        gw.live.failure(backend_name)
                    lease.release(gw)
                    lease = None
                    if exc.kind == "connect" and len(urls) > 1:
                        gw.endpoints.state(base).up = False  # until a health check passes
                        if any(gw.endpoints.state(u).up for u in urls):
                            attempts.insert(i + 1, backend_name)  # another engine of it
                    if i + 1 < len(attempts):
                        record.retries += 1
                        gw.metrics.retries.labels(record.route, attempts[i + 1]).inc()
            if watch.gone:
                record.outcome = "client_gone"
                return
            if resp is None:
                status = 504 if last_error is not None and last_error.kind == "timeout" else 502
                if last_error is not None and last_error.status == 503:
                    status = 503
                record.outcome, record.status = "upstream_error", status
                await respond_error(send, status, f"no backend could serve the request: "
                                    f"backend {record.backend!r}: {last_error}", headers=[*extra, (b"retry-after", b"5")])
                return

            async def resume() -> tuple[Any, bytes] | None:
                """Continue a broken chat stream on another variant of the same weights."""
                nonlocal resp, lease
                route = policy.routes[record.route]
                if not route.spec.continuation or endpoint != "chat" or \
                        not can_continue(body, filt_of[0]):
                    return None
                failed = record.backend
                state = gw.live.snapshot()
                served = policy.backend(failed).served_model_name
                for name in route.variants:
                    backend = policy.backend(name)
                    health = state.backends.get(name)
                    if name == failed or backend.served_model_name != served or \
                            (health is not None and health.health != "up"):
                        continue
                    if not gw.admission.try_acquire(name, backend.max_concurrency):
                        continue  # a continuation does not queue
                    base = backend.endpoints[0] if len(backend.endpoints) == 1 else \
                        gw.endpoints.pick(backend.endpoints, prefix_affinity(body))
                    new_lease = Lease.begin(gw, record, name, base, backend.max_concurrency)
                    filt = filt_of[0]
                    assert isinstance(filt, ContinuableFilter)
                    cont = continuation_body(body, filt.partial(), filt.m.completion_tokens)
                    try:
                        new_resp, new_first = await self._open(
                            policy, watch, cont, endpoint, decision, record, headers, backend,
                            base, check_status=True, usage_of=body, push=push)
                    except UpstreamError as exc:
                        gw.metrics.upstream_errors.labels(name, exc.kind).inc()
                        new_lease.release(gw)
                        continue
                    if resp is not None:
                        resp.close()
                    if lease is not None:
                        lease.release(gw)
                    resp, lease = new_resp, new_lease
                    gw.metrics.upstream_errors.labels(failed, "midstream").inc()
                    gw.live.failure(failed)
                    gw.metrics.continuations.labels(record.route, failed, name).inc()
                    record.backend, record.continued = name, True
                    filt.start_continuation()
                    return new_resp, new_first
                return None

            filt_of: list[StreamFilter] = []
            await self._relay(policy.backend(record.backend), resp, first, send, watch, body,
                              endpoint, model, record, extra, resume, filt_of,
                              policy.routes[record.route].spec.continuation, push)
        finally:
            if isinstance(resp, EngineStream):
                resp.close()
            elif resp is not None:
                if resp.content.at_eof() and record.outcome == "ok":
                    resp.release()
                else:
                    resp.close()
            if lease is not None:
                lease.release(gw)
            gw.in_flight.pop(id(record), None)
            record.m.t_end = time.perf_counter()
            if record.outcome == "client_gone" and record.backend:
                gw.metrics.client_disconnects.labels(record.route, record.backend).inc()
            gw.metrics.observe_request(record.route, record.backend or "none", record.client,
                                       record.outcome, record.m)
            gw.finished(record)

    async def _open(self, policy: Any, watch: DisconnectWatch, body: dict[str, Any],
                    endpoint: Endpoint, decision: Any, record: RequestRecord,
                    headers: dict[bytes, bytes], backend: Any, base: str, *,
                    check_status: bool, usage_of: dict[str, Any] | None = None,
                    push: PushChannel | None = None,
                    ) -> tuple[aiohttp.ClientResponse | EngineStream, bytes]:
        """Send the request to one engine and wait for its first body bytes."""
        gw = self.gw
        usage = plan_usage(usage_of or body, endpoint, backend.kind)
        inject = dict(decision.inject)
        if decision.priority is not None and backend.priority_scheduling:
            inject.setdefault("priority", decision.priority)
        payload = upstream_body(body, inject, backend.served_model_name, usage)
        up_headers = _upstream_headers(headers, record.request_id,
                                       gw.operator.secret(backend.api_key))
        if push is not None:
            watch.pending = asyncio.ensure_future(self._open_stream(
                base + _PATHS[endpoint], payload, up_headers, check_status))
            stream: EngineStream
            stream, first = await watch.pending
            watch.pending = None
            watch.response = stream
            return stream, first
        watch.pending = asyncio.ensure_future(
            gw.upstream.post(base + _PATHS[endpoint], payload, up_headers))
        resp: aiohttp.ClientResponse = await watch.pending
        watch.pending = None
        watch.response = resp
        try:
            if resp.status >= 500 and check_status:
                raise UpstreamError("status", f"backend answered {resp.status}", resp.status)
            return resp, await first_chunk(resp, gw.settings.first_byte_timeout_s)
        except BaseException:
            resp.close()
            watch.response = None
            raise

    async def _open_stream(self, url: str, payload: bytes, headers: dict[str, str],
                           check_status: bool) -> tuple[EngineStream, bytes]:
        """The push relay's request, on a kept-alive connection; the first body bytes awaited."""
        settings = self.gw.settings
        try:
            async with asyncio.timeout(settings.first_byte_timeout_s):
                stream = await open_engine_stream(self.gw.engines, url, payload, headers,
                                                  settings.connect_timeout_s)
                try:
                    if stream.status >= 500 and check_status:
                        raise UpstreamError("status", f"backend answered {stream.status}",
                                            stream.status)
                    if not stream.pending:
                        await stream.first
                    first = stream.take_pending()
                    if not first and stream.status == 200:
                        raise UpstreamError("connect", "backend closed the response before "
                                            "the first byte")
                    return stream, first
                except BaseException:
                    stream.close()
                    raise
        except TimeoutError as exc:
            raise UpstreamError("timeout", f"no first byte in "
                                f"{settings.first_byte_timeout_s:g}s") from exc

    async def _relay(self, backend: Any, resp: Any, first: bytes, send: Send,
                     watch: DisconnectWatch, body: dict[str, Any], endpoint: Endpoint,
                     model: str, record: RequestRecord, extra: list[tuple[bytes, bytes]],
                     resume: Resume, filt_of: list[StreamFilter], continuation: bool,
                     push: PushChannel | None) -> None:
        gw = self.gw
        served = backend.served_model_name
        rename = None
        encoded = "content-encoding" in resp.headers  # asked for identity; relay it as it is
        if served != model and not encoded:
            rename = (b'"model":"' + served.encode() + b'"', b'"model":"' + model.encode() + b'"')
        # Raw header bytes: a value outside latin-1 passes through rather than failing here.
        out_headers = [(k.lower(), v) for k, v in resp.raw_headers
                       if k.lower().decode("latin-1") not in RESPONSE_DROP
                       and k.lower() != b"x-request-id"]
        if resp.status in (429, 503) and "retry-after" not in resp.headers:
            out_headers.append((b"retry-after", b"5"))
        # A compressed stream (the backend ignored `accept-encoding: identity`) cannot be read
        # frame by frame: it goes through as a plain body, with its content-encoding.
        is_sse = not encoded and \
            resp.headers.get("content-type", "").startswith("text/event-stream")
        if is_sse:
            out_headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        record.status = resp.status
        chosen = record.backend.encode()
        reason = record.reason + (f"+retry{record.retries}" if record.retries else "")
        extra = [*extra, (b"x-specrouter-backend", chosen), (b"x-specrouter-variant", chosen),
                 (b"x-specrouter-reason", reason.encode())]
        await send({"type": "http.response.start", "status": resp.status,
                    "headers": out_headers + extra})
        if is_sse:
            usage = plan_usage(body, endpoint, backend.kind)
            continuable = endpoint == "chat" and continuation
            cls = ContinuableFilter if continuable else StreamFilter
            filt = cls(record.m, strip_usage=usage.strip_usage,
                       drop_usage_chunk=usage.drop_usage_chunk, rename=rename)
            filt_of.append(filt)
            ends = RESPONSES_ENDS if endpoint == "responses" else CHAT_ENDS
            if isinstance(resp, EngineStream) and push is not None:
                record.outcome = await relay_sse_push(resp, first, push, send, watch, filt,
                                                      gw.settings.idle_timeout_s, ends,
                                                      resume if continuable else None)
            else:
                record.outcome = await relay_sse(resp, first, send, watch, filt,
                                                 gw.settings.idle_timeout_s, ends,
                                                 resume if continuable else None)
        elif isinstance(resp, EngineStream) and push is not None:
            record.outcome = await relay_body_push(resp, first, push, send, watch, record.m,
                                                   gw.settings.idle_timeout_s)
        else:
            record.outcome = await relay_body(resp, first, send, watch, record.m, rename,
                                              gw.settings.idle_timeout_s)
        if record.outcome in ("upstream_error", "timeout") and record.m.chunks:
            gw.metrics.upstream_errors.labels(record.backend, "midstream").inc()
            gw.live.failure(record.backend)


class Lease:
    """One request's hold on one engine: admission slot, in-flight counts, gauges."""

    __slots__ = ("backend", "base", "limit", "route")

    def __init__(self, backend: str, base: str, limit: int, route: str) -> None:
        self.backend, self.base, self.limit, self.route = backend, base, limit, route

    @classmethod
    def begin(cls, gw: Gateway, record: RequestRecord, backend: str, base: str,
              limit: int) -> Lease:
        """The admission slot is already held; count the request everywhere else."""
        gw.live.begin(backend)
        gw.endpoints.state(base).in_flight += 1
        record.concurrency = gw.live.get(backend).in_flight
        gw.metrics.in_flight.labels(record.route, backend).inc()
        return cls(backend, base, limit, record.route)

    def release(self, gw: Gateway) -> None:
        gw.live.end(self.backend)
        gw.endpoints.state(self.base).in_flight -= 1
        gw.metrics.in_flight.labels(self.route, self.backend).dec()
        gw.admission.release(self.backend, self.limit)


_PATHS: dict[Endpoint, str] = {v: k for k, v in ENDPOINTS.items()}
_FORWARD_HEADERS = (b"x-session-id", b"x-data-parallel-rank", b"traceparent", b"tracestate")


def _upstream_headers(headers: dict[bytes, bytes], request_id: str,
                      key: str | None) -> dict[str, str]:
    out = {"content-type": "application/json", "accept-encoding": "identity",
           "x-request-id": request_id}
    for name in _FORWARD_HEADERS:
        value = headers.get(name)
        if value is not None:
            out[name.decode()] = value.decode("latin-1")
    if key:
        out["authorization"] = f"Bearer {key}"
    return out


def _fmt(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


async def _unauthorized(send: Send, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await respond_error(send, 401, "invalid or missing API key: send `Authorization: Bearer KEY`",
                        type_="AuthenticationError", code="invalid_api_key",
                        headers=[*(headers or []), (b"www-authenticate", b"Bearer")])


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
