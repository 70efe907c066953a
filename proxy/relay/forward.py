"""A decided request to an engine: attempts, admission, the engine lease, retries before the
first byte, and the response start; the body then goes through the exchange's relay
(proxy/relay/push.py or pull.py)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from policies.capabilities import capabilities
from policies.types import Endpoint
from proxy.backends.admission import AdmissionTimeout
from proxy.backends.endpoints import prefix_affinity
from proxy.relay.asgi import respond_error
from proxy.relay.continuation import ContinuableFilter
from proxy.relay.ends import CHAT_ENDS, RESPONSES_ENDS
from proxy.relay.events import reader_for
from proxy.relay.measure import StreamFilter
from proxy.relay.rewrite import plan_usage, upstream_body
from proxy.relay.upstream import RESPONSE_ALLOW, UpstreamError, not_an_answer

if TYPE_CHECKING:
    from policies.schema import BackendSpec
    from proxy.gateway import Gateway
    from proxy.relay.exchange import Exchange, R

# The public paths that generate; each goes to the same path on the engine.
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}
_PATHS: dict[Endpoint, str] = {v: k for k, v in ENDPOINTS.items()}
_FORWARD_HEADERS = (b"x-session-id", b"x-data-parallel-rank", b"traceparent", b"tracestate")


async def forward(x: Exchange[R]) -> None:
    """Send the request to the first engine that answers and relay its answer; then account
    for the request, however it ended."""
    gw, record = x.gw, x.record
    gw.in_flight[id(record)] = record
    try:
        if await _connect(x):
            await _relay(x)
    finally:
        if x.resp is not None:
            x.resp.finish(record.outcome == "ok")
        if x.lease is not None:
            x.lease.release(gw)
        gw.in_flight.pop(id(record), None)
        record.m.t_end = time.perf_counter()
        if record.outcome == "client_gone" and record.backend:
            gw.metrics.client_disconnects.labels(record.route, record.backend).inc()
        gw.metrics.observe_request(record.route, record.backend or "none", record.client,
                                   record.outcome, record.m)
        gw.finished(record)


async def _connect(x: Exchange[R]) -> bool:
    """Try the decided backend, then its fallbacks, until one sends a first byte (`x.resp`);
    False when the client is gone or has been answered with an error."""
    gw, policy, record, watch = x.gw, x.policy, x.record, x.watch
    attempts: list[Any] = [x.decision.backend, *x.decision.fallbacks]
    last_error: UpstreamError | None = None
    for i, backend_name in enumerate(attempts):
        if watch.gone:
            break
        backend = policy.backend(backend_name)
        urls = backend.endpoints
        base = urls[0] if len(urls) == 1 else gw.endpoints.pick(urls, prefix_affinity(x.body))
        record.backend = backend_name
        if not gw.admission.try_acquire(backend_name, backend.max_concurrency):
            try:
                gw.metrics.queued.labels(backend_name).inc()
                await watch.wait(gw.admission.acquire(
                    backend_name, backend.max_concurrency, record.client,
                    policy.document.admission.queue_timeout_s))
            except AdmissionTimeout as exc:
                record.outcome, record.status = "rejected", 503
                await respond_error(x.send, 503, f"backend busy: {exc}",
                                    headers=[*x.extra, (b"retry-after", b"2")])
                return False
            except asyncio.CancelledError:
                if not watch.gone:
                    raise
                break
            finally:
                gw.metrics.queued.labels(backend_name).dec()
        x.lease = lease = Lease.begin(x, backend_name, base, backend.max_concurrency)
        try:
            x.resp, x.first = await open_engine(x, x.body, backend, base, i + 1 < len(attempts))
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
            x.lease = None
            if exc.kind == "connect" and len(urls) > 1:
                gw.endpoints.state(base).up = False  # until a health check passes
                if any(gw.endpoints.state(u).up for u in urls):
                    attempts.insert(i + 1, backend_name)  # another engine of it
            if i + 1 < len(attempts):
                record.retries += 1
                gw.metrics.retries.labels(record.route, attempts[i + 1]).inc()
    if watch.gone:
        record.outcome = "client_gone"
        return False
    if x.resp is None:
        status = 504 if last_error is not None and last_error.kind == "timeout" else 502
        if last_error is not None and last_error.status == 503:
            status = 503
        record.outcome, record.status = "upstream_error", status
        await respond_error(x.send, status, f"no backend could serve the request: "
                            f"backend {record.backend!r}: {last_error}",
                            headers=[*x.extra, (b"retry-after", b"5")])
        return False
    return True


async def open_engine(x: Exchange[R], body: dict[str, Any], backend: BackendSpec, base: str,
                      check_status: bool) -> tuple[R, bytes]:
    """Send `body` (the request, or its continuation) to one engine; its answer and first
    body bytes."""
    usage = plan_usage(x.body, x.endpoint, backend.kind)
    decision = x.decision
    inject = dict(decision.inject)
    if decision.priority is not None and backend.priority_scheduling:
        inject.setdefault("priority", decision.priority)
    payload = upstream_body(body, inject, backend.served_model_name, usage)
    up_headers = _upstream_headers(x.headers, x.request_id, x.gw.operator.secret(backend.api_key))
    if x.resp is None:  # not a continuation: this attempt is the one the timings describe
        m = x.record.m
        m.t_engine, m.t_headers = time.perf_counter(), None
    resp, first = await x.relay.open(x, base + _PATHS[x.endpoint], payload, up_headers,
                                     check_status)
    refused = not_an_answer(resp.status, resp.headers)
    if refused is not None:  # before the first byte went out: another engine may answer
        resp.close()
        raise refused
    return resp, first


async def _relay(x: Exchange[R]) -> None:
    """The response start, then the body through the push or pull relay."""
    gw, record, resp, endpoint = x.gw, x.record, x.resp, x.endpoint
    assert resp is not None
    backend = x.policy.backend(record.backend)
    served, model = backend.served_model_name, x.model
    encoded = "content-encoding" in resp.headers  # asked for identity; relay it as it is
    if served != model and not encoded:
        x.rename = (b'"model":"' + served.encode() + b'"', b'"model":"' + model.encode() + b'"')
    # Raw header bytes: a value outside latin-1 passes through rather than failing here.
    out_headers = [(k.lower(), v) for k, v in resp.raw_headers
                   if k.lower().decode("latin-1") in RESPONSE_ALLOW]
    if resp.status in (429, 503) and "retry-after" not in resp.headers:
        out_headers.append((b"retry-after", b"5"))
    # A compressed stream (the backend ignored `accept-encoding: identity`) cannot be read
    # frame by frame: it goes through as a plain body, with its content-encoding.
    is_sse = not encoded and \
        resp.headers.get("content-type", "").startswith("text/event-stream")
    if is_sse:  # each set once: llama.cpp sends its own x-accel-buffering
        present = {k for k, _ in out_headers}
        out_headers += [(k, v) for k, v in ((b"cache-control", b"no-cache"),
                                            (b"x-accel-buffering", b"no")) if k not in present]
    record.status = resp.status
    chosen = record.backend.encode()
    reason = record.reason + (f"+retry{record.retries}" if record.retries else "")
    extra = [*x.extra, (b"x-specrouter-backend", chosen), (b"x-specrouter-variant", chosen),
             (b"x-specrouter-reason", reason.encode())]
    await x.send({"type": "http.response.start", "status": resp.status,
                  "headers": out_headers + extra})
    if is_sse:
        usage = plan_usage(x.body, endpoint, backend.kind)
        x.continuable = endpoint == "chat" and x.policy.routes[record.route].spec.continuation
        cls = ContinuableFilter if x.continuable else StreamFilter
        record.m.stream = True
        x.filt = cls(record.m, strip_usage=usage.strip_usage,
                     drop_usage_chunk=usage.drop_usage_chunk, rename=x.rename,
                     engine_timings="timings" in capabilities(backend.kind).per_request,
                     events=reader_for(endpoint, record.m))
        x.ends = RESPONSES_ENDS if endpoint == "responses" else CHAT_ENDS
        record.outcome = await x.relay.sse(x)
    else:
        record.outcome = await x.relay.body(x)
    if record.outcome in ("upstream_error", "timeout") and record.m.chunks:
        gw.metrics.upstream_errors.labels(record.backend, "midstream").inc()
        gw.live.failure(record.backend)


class Lease:
    """One request's hold on one engine: admission slot, in-flight counts, gauges."""

    __slots__ = ("backend", "base", "limit", "route")

    def __init__(self, backend: str, base: str, limit: int, route: str) -> None:
        self.backend, self.base, self.limit, self.route = backend, base, limit, route

    @classmethod
    def begin(cls, x: Exchange[Any], backend: str, base: str, limit: int) -> Lease:
        """The admission slot is already held; count the request everywhere else."""
        gw, record = x.gw, x.record
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

