"""A decided request to an engine: attempts, admission, the engine lease, retries before the
first byte, and the response start; the body then goes through the exchange's relay
(proxy/relay/push.py or pull.py), and a stream that breaks mid-answer is continued here, once,
on another variant of the same weights (the plan is proxy/relay/continuation.py's)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

import orjson

from policies.capabilities import capabilities
from policies.types import Endpoint
from proxy.backends.admission import AdmissionTimeout
from proxy.observe.finished import observe_record
from proxy.relay.adapt import adapt
from proxy.relay.asgi import with_should_retry
from proxy.relay.continuation import Broken, ContinuableFilter, can_continue, plan_continuation
from proxy.relay.ends import CHAT_ENDS, MESSAGES_ENDS, RESPONSES_ENDS, end_stream, end_with_error
from proxy.relay.events import reader_for
from proxy.relay.exchange import PlainBody, StreamRelay
from proxy.relay.hold import hold, turn_ended
from proxy.relay.keepalive import COMMENT_PING, PINGS, SSE_HEADERS, Pinger
from proxy.relay.lease import Lease
from proxy.relay.measure import StreamFilter, withhold_estimate
from proxy.relay.owned import session_fields
from proxy.relay.rewrite import plan_usage, upstream_pieces
from proxy.relay.sglang import ask as sglang_ask
from proxy.relay.sglang_stream import BodyCut, SglangContinuableFilter, SglangFilter, asks
from proxy.relay.tracecontext import trace_headers
from proxy.relay.turnstate import HEADER as TURN_STATE
from proxy.relay.upstream import (
    RESPONSE_ALLOW,
    UpstreamError,
    not_an_answer,
    not_json,
)

if TYPE_CHECKING:
    from policies.schema import BackendSpec
    from proxy.relay.exchange import Exchange, R

# The public paths that generate; each goes to the same path on the engine.
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
    "/v1/messages": "messages",
    "/v1/messages/count_tokens": "messages",
}
# Not x-session-id: the client's raw id never goes upstream, only the gateway's scoped one;
# the trace headers go bounded (proxy/relay/tracecontext.py).
_FORWARD_HEADERS = (b"x-data-parallel-rank",)


async def forward(x: Exchange[R]) -> None:
    """Send the request to the first engine that answers and relay its answer; then account
    for the request, however it ended."""
    gw, record = x.gw, x.decided.record
    gw.in_flight[id(record)] = record
    x.engine.pinger = _route_pinger(x)
    try:
        if await _connect(x):
            await _relay(x)
    finally:
        if x.engine.pinger is not None:
            x.engine.pinger.cancel()
        turn_ended(x)
        if x.engine.resp is not None:
            x.engine.resp.finish(record.outcome == "ok")
        if x.engine.lease is not None:
            x.engine.lease.release(gw)
        gw.in_flight.pop(id(record), None)
        record.m.t_end = time.perf_counter()
        observe_record(gw.metrics, record)
        gw.finished(record)


async def _connect(x: Exchange[R]) -> bool:
    """Try the decided backend, then its fallbacks, until one sends a first byte
    (`x.engine.resp`); False when the client is gone or has been answered with an error."""
    gw, policy, record, watch = x.gw, x.arrival.policy, x.decided.record, x.engine.watch
    decision = x.decided.decision
    held = await hold(x, lambda every: _pinger(x, every))  # session-aware admission
    if held.backend is None:
        if watch.gone:
            record.outcome = "client_gone"
            return False
        record.outcome, record.status = "rejected", 503
        await _refuse(x, 503, held.timed_out, b"5")
        return False
    attempts: list[Any] = [held.backend, *decision.fallbacks]
    if held.backend != decision.backend:  # moved: the decided engine is a fallback now
        attempts = [
            held.backend,
            *(a for a in (decision.backend, *decision.fallbacks) if a != held.backend),
        ]
    last_error: UpstreamError | None = None
    for i, backend_name in enumerate(attempts):
        if watch.gone:
            break
        backend = policy.backend(backend_name)
        urls = backend.engine_urls
        base = urls[0] if len(urls) == 1 else gw.engine_table.pick(urls, x.decided.affinity)
        record.backend = backend_name
        if not gw.admission.try_acquire(backend_name, backend.max_concurrency):
            try:
                gw.metrics.queued.labels(backend_name).inc()
                await watch.wait(
                    gw.admission.acquire(
                        backend_name,
                        backend.max_concurrency,
                        record.client,
                        policy.document.admission.queue_timeout_s,
                    )
                )
            except AdmissionTimeout as exc:
                record.outcome, record.status = "rejected", 503
                await _refuse(x, 503, f"backend busy: {exc}", b"2")
                return False
            except asyncio.CancelledError:
                if not watch.gone:
                    raise
                break
            finally:
                gw.metrics.queued.labels(backend_name).dec()
        x.engine.lease = lease = Lease.begin(
            x.gw, record, backend_name, base, backend.max_concurrency
        )
        try:
            x.engine.resp, x.engine.first = await open_engine(
                x, x.body, backend, base, i + 1 < len(attempts)
            )
            gw.live.success(backend_name)
            break
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            break
        except UpstreamError as exc:
            last_error = exc
            record.upstream_errors += ((backend_name, exc.kind),)
            if exc.kind == "connect" and exc.status is None and len(urls) == 1:
                gw.live.down_now(backend_name)
            else:
                gw.live.failure(backend_name)
            lease.release(gw)
            x.engine.lease = None
            if exc.accepted:
                break  # the engine has the request: sending it again would double the load
            if exc.kind == "connect" and len(urls) > 1:
                gw.engine_table.state(base).up = False  # until a health check passes
                if any(gw.engine_table.state(u).up for u in urls):
                    attempts.insert(i + 1, backend_name)  # another engine of it
            if i + 1 < len(attempts):
                record.retries += 1
                record.retried_to += (attempts[i + 1],)
    if watch.gone:
        record.outcome = "client_gone"
        return False
    if x.engine.resp is None:
        status = 504 if last_error is not None and last_error.kind == "timeout" else 502
        if last_error is not None and last_error.status == 503:
            status = 503
        record.outcome, record.status = "upstream_error", status
        await _refuse(
            x,
            status,
            f"no backend could serve the request: backend {record.backend!r}: {last_error}",
            b"5",
        )
        return False
    return True


def _route_pinger(x: Exchange[R]) -> Pinger | None:
    """Pings while no engine byte came, when the route asks for them (streams only)."""
    every = x.arrival.policy.routes[x.decided.record.route].spec.keepalive_s
    if every is None or x.body.get("stream") is not True or x.arrival.endpoint == "embeddings":
        return None
    return _pinger(x, every)


def _pinger(x: Exchange[R], every: float) -> Pinger:
    """Pings every `every` seconds until the engine's first byte."""
    return Pinger(
        x.send,
        every,
        x.arrival.t0,
        PINGS.get(x.arrival.endpoint, COMMENT_PING),
        lambda: [*SSE_HEADERS, *_our_headers(x)],
    )


async def _refuse(x: Exchange[R], status: int, message: str, retry_after: bytes) -> None:
    """No engine answered: an error response, or the error event once pings went out."""
    if x.engine.pinger is not None and await x.engine.pinger.stop():
        x.decided.record.status = 200  # what the client got
        await end_with_error(x.send, x.arrival.endpoint, status, message)
        return
    await x.error(status, message, headers=[*x.decided.extra, (b"retry-after", retry_after)])


async def open_engine(
    x: Exchange[R], body: dict[str, Any], backend: BackendSpec, base: str, check_status: bool
) -> tuple[R, bytes]:
    """Send `body` (the request, or its continuation) to one engine; its answer and first
    body bytes."""
    arrival, decided = x.arrival, x.decided
    endpoint, record = arrival.endpoint, decided.record
    usage = plan_usage(x.body, endpoint, backend.kind)
    version = backend.engine.vllm_version or arrival.policy.document.deployment.vllm_version
    # The rules that may change the request were read before its tree was freed; a
    # continuation's body is another, judged whole.
    only = decided.adaptable if body is x.body else None
    body, adapted = adapt(
        body, endpoint, backend.kind, version, only, opted_in=backend.developer_in_place
    )
    record.adapted = adapted  # the answering engine's (the last attempt's)
    # proxy/relay/adapt.py: what this engine refuses or is asked to change, counted per attempt
    record.adaptations += tuple((rule, record.backend) for rule in adapted)
    decision = decided.decision
    inject = dict(decision.inject)
    if backend.kind == "sglang" and asks(body, endpoint, usage):
        inject.update(sglang_ask(body))  # its spec figures, cut again (sglang_stream.py)
    if decision.priority is not None and backend.priority_scheduling:
        inject.setdefault("priority", decision.priority)
    # the session the engine tags the request's KV blocks with is the gateway's (owned.py)
    body, session = session_fields(body, endpoint, backend.kind, version, record.session)
    inject.update(session)
    payload = upstream_pieces(body, inject, backend.served_model_name, usage, x.encoded)
    up_headers = _upstream_headers(
        arrival.headers, arrival.request_id, x.gw.operator.secret(backend.api_key), record.session
    )
    # the gateway's span is the engine's parent when tracing (proxy/observe/otel.py)
    up_headers.update(trace_headers(arrival.headers, record.traceparent))
    if x.engine.resp is None:  # not a continuation: this attempt is the one the timings describe
        m = record.m
        m.t_engine, m.t_headers = time.perf_counter(), None
    resp, first = await x.engine.relay.open(
        x, base + arrival.path, payload, up_headers, check_status
    )
    whole = resp.whole()
    refused = not_an_answer(resp.status, resp.headers) or not_json(
        resp.status, resp.headers, first, whole
    )
    if refused is not None:  # before the first byte went out: another engine may answer
        resp.close()
        raise refused
    return resp, first


async def _relay(x: Exchange[R]) -> None:
    """The response start, then the body through the push or pull relay."""
    gw, record, resp, endpoint = x.gw, x.decided.record, x.engine.resp, x.arrival.endpoint
    assert resp is not None
    backend = x.arrival.policy.backend(record.backend)
    served, model = backend.served_model_name, x.decided.model
    encoded = "content-encoding" in resp.headers  # asked for identity; relay it as it is
    rename = None  # served model name -> client's
    if served != model and not encoded:
        rename = (b'"model":"' + served.encode() + b'"', b'"model":"' + model.encode() + b'"')
    # Raw header bytes: a value outside latin-1 passes through rather than failing here.
    out_headers = [
        (k.lower(), v) for k, v in resp.raw_headers if k.lower().decode("latin-1") in RESPONSE_ALLOW
    ]
    if resp.status in (429, 503) and "retry-after" not in resp.headers:
        out_headers.append((b"retry-after", b"5"))
    if resp.status >= 400:
        out_headers = with_should_retry(out_headers)
    # A compressed stream (the backend ignored `accept-encoding: identity`) cannot be read
    # frame by frame: it goes through as a plain body, with its content-encoding.
    is_sse = not encoded and resp.headers.get("content-type", "").startswith("text/event-stream")
    if is_sse:  # each set once: llama.cpp sends its own x-accel-buffering
        present = {k for k, _ in out_headers}
        out_headers += [
            (k, v)
            for k, v in ((b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no"))
            if k not in present
        ]
    if x.engine.pinger is not None and await x.engine.pinger.stop():
        record.status = 200  # sent with the pings; the engine's own headers stay here
        if not is_sse:  # an error answer: its message, as the engine-style error event
            record.outcome = "upstream_error"
            await end_with_error(
                x.send, endpoint, resp.status, _engine_message(x.engine.first, resp.status)
            )
            return
    else:
        record.status = resp.status
        if is_sse and x.engine.channel is not None:  # the push relay sends it with the first event
            x.engine.channel.hold_head()
        await x.send(
            {
                "type": "http.response.start",
                "status": resp.status,
                "headers": out_headers + _our_headers(x),
            }
        )
    spec = backend.speculative
    withhold_estimate(record.m, x.body, spec.num_speculative_tokens if spec else None)
    usage = plan_usage(x.body, endpoint, backend.kind)
    if is_sse:
        continuable = _continuable(x)
        cls = ContinuableFilter if continuable else StreamFilter
        if backend.kind == "sglang":
            cls = SglangContinuableFilter if continuable else SglangFilter
        record.m.stream = True
        filt = cls(
            record.m,
            strip_usage=usage.strip_usage,
            drop_usage_chunk=usage.drop_usage_chunk,
            rename=rename,
            engine_timings="timings" in capabilities(backend.kind).per_request,
            events=reader_for(endpoint, record.m),
        )
        if isinstance(filt, (SglangFilter, SglangContinuableFilter)):
            filt.asked = asks(x.body, endpoint, usage)
        x.stream = StreamRelay(filt, _ENDS.get(endpoint, CHAT_ENDS), continuable)
        if not continuable:
            x.drop_body()
        record.outcome = await _relay_stream(x)
    else:
        cut = None
        if backend.kind == "sglang" and not encoded and asks(x.body, endpoint, usage):
            cut = BodyCut()  # the spec figures asked for the measurement
        x.plain = PlainBody(rename, cut)
        x.drop_body()
        record.outcome = await x.engine.relay.body(x)
    if record.outcome in ("upstream_error", "timeout") and record.m.chunks:
        record.upstream_errors += ((record.backend, "midstream"),)
        gw.live.failure(record.backend)


def _continuable(x: Exchange[Any]) -> bool:
    """A stream another variant may finish (proxy/relay/continuation.py)."""
    return (
        x.arrival.endpoint == "chat"
        and x.arrival.policy.routes[x.decided.record.route].spec.continuation
    )


async def _relay_stream(x: Exchange[R]) -> str:
    """The engine's event stream through the relay; a broken one continued once by another
    engine (`resume_stream`), then the client's stream ended. The outcome."""
    resume = x.stream.continuable
    while True:
        core = await x.engine.relay.sse(x)
        if isinstance(core, str):
            return core  # the client left
        if not core.wants_continuation(resume, x.engine.watch.closing is not None):
            break
        resume = False  # once per request
        resumed = await resume_stream(x)
        if resumed is None:
            break
        x.engine.resp, x.engine.first = resumed
    outcome, error = core.result()
    # A client that reads nothing ran the idle deadline out in the relay; its last event must
    # not wait for it without end (uvicorn's `send` waits for the socket to drain).
    deadlines = x.gw.last_write
    deadline = deadlines.start()
    try:
        return await end_stream(x.send, x.stream.filt, outcome, error)
    except asyncio.CancelledError:
        if not deadlines.expired(deadline):
            raise
        return "client_gone"
    finally:
        deadlines.end(deadline)


async def resume_stream(x: Exchange[R]) -> tuple[R, bytes] | None:
    """Continue a broken chat stream on another variant of the same weights, as its plan
    says; the new engine's answer and first bytes, or None."""
    gw, policy, record, filt = x.gw, x.arrival.policy, x.decided.record, x.stream.filt
    route = policy.routes[record.route]
    if not route.spec.continuation or x.arrival.endpoint != "chat":
        return None
    body = x.parsed_body()  # the body's containers were kept serialised (Exchange.release_tree)
    if not can_continue(body, filt):
        return None
    failed = record.backend
    assert isinstance(filt, ContinuableFilter)
    health = gw.live.snapshot().backends
    down = {name for name, h in health.items() if h.health != "up"}
    backends = {name: policy.backend(name) for name in (failed, *route.variants)}
    broken = Broken(failed, filt.partial(), filt.m.completion_tokens)
    plan = plan_continuation(body, broken, route.variants, backends, down)
    for name, refused in plan.steps:
        if refused is not None:
            record.continuations_refused += ((failed, name, refused),)
            continue
        backend = backends[name]
        if not gw.admission.try_acquire(name, backend.max_concurrency):
            continue  # a continuation does not queue
        base = (
            backend.engine_urls[0]
            if len(backend.engine_urls) == 1
            else gw.engine_table.pick(backend.engine_urls, x.decided.affinity)
        )
        new_lease = Lease.begin(gw, record, name, base, backend.max_concurrency)
        try:
            new_resp, new_first = await open_engine(x, plan.body, backend, base, True)
        except UpstreamError as exc:
            record.upstream_errors += ((name, exc.kind),)
            new_lease.release(gw)
            if exc.accepted:
                return None  # that engine has the continuation: not sent again
            continue
        if x.engine.resp is not None:
            x.engine.resp.close()
        if x.engine.lease is not None:
            x.engine.lease.release(gw)
        x.engine.resp, x.engine.lease = new_resp, new_lease
        record.upstream_errors += ((failed, "midstream"),)
        gw.live.failure(failed)
        record.continuations += ((failed, name),)
        record.backend, record.continued_from = name, failed
        filt.start_continuation(body)
        return new_resp, new_first
    return None


# How an API's event stream ends, by API kind.
_ENDS: dict[Endpoint, tuple[bytes, ...]] = {"responses": RESPONSES_ENDS, "messages": MESSAGES_ENDS}


def _our_headers(x: Exchange[R]) -> list[tuple[bytes, bytes]]:
    """The gateway's response headers: request id, defaults, the backend chosen and why."""
    record = x.decided.record
    chosen = record.backend.encode()
    reason = record.reason + (f"+retry{record.retries}" if record.retries else "")
    # One header names what served: the variant (the policy's backend), as the pin header does.
    out = [
        *x.decided.extra,
        (b"x-specrouter-variant", chosen),
        (b"x-specrouter-reason", reason.encode()),
    ]
    # A Codex turn's first answer names its engine in a token Codex echoes within the turn.
    if (
        x.arrival.endpoint == "responses"
        and record.session
        and record.agent.startswith("codex")
        and not record.turn_state
        and not record.signals.keeps_place
    ):
        token = x.gw.turn_state.issue(record.client, record.session, record.backend, time.time())
        if token is not None:
            out.append((TURN_STATE, token))
            record.turn_state = "issued"
    return out


def _engine_message(first: bytes, status: int) -> str:
    """The message of an engine's error body (its first bytes), or its status."""
    try:
        obj = orjson.loads(first)
        message = obj["error"]["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return f"backend answered {status}"
    return str(message)


def _upstream_headers(
    headers: dict[bytes, bytes], request_id: str, key: str | None, session: str
) -> dict[str, str]:
    out = {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "x-request-id": request_id,
    }
    for name in _FORWARD_HEADERS:
        value = headers.get(name)
        if value is not None:
            out[name.decode()] = value.decode("latin-1")
    if session:  # the gateway's notion (policies/sessions.py), scoped and bounded, not the raw id
        out["x-session-id"] = session
    if key:
        out["authorization"] = f"Bearer {key}"
    return out
