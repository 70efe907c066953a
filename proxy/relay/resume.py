"""A broken chat stream continued on another variant of the same weights (the sans-io parts,
the filter and the plan, which engine next and what to resend, are
proxy/relay/continuation.py's); the relays (push.py, pull.py) ask once per request."""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.relay.continuation import (
    ContinuableFilter,
    can_continue,
    plan_continuation,
)
from proxy.relay.forward import open_engine
from proxy.relay.lease import Lease
from proxy.relay.upstream import UpstreamError

if TYPE_CHECKING:
    from proxy.relay.exchange import Exchange, R


async def resume_stream(x: Exchange[R]) -> tuple[R, bytes] | None:
    """Continue a broken chat stream on another variant of the same weights; the relays
    ask once per request."""
    gw, policy, record, filt = x.gw, x.policy, x.record, x.filt
    route = policy.routes[record.route]
    if not route.spec.continuation or x.endpoint != "chat":
        return None
    body = x.parsed_body()  # the body's containers were kept serialised (Exchange.release_tree)
    if not can_continue(body, filt):
        return None
    failed = record.backend
    assert isinstance(filt, ContinuableFilter)
    health = gw.live.snapshot().backends
    down = {name for name, h in health.items() if h.health != "up"}
    backends = {name: policy.backend(name) for name in (failed, *route.variants)}
    plan = plan_continuation(
        body, filt.partial(), filt.m.completion_tokens, failed, route.variants, backends, down
    )
    for name, refused in plan.steps:
        if refused is not None:
            gw.metrics.continuations_refused.labels(record.route, failed, name, refused).inc()
            continue
        backend = backends[name]
        if not gw.admission.try_acquire(name, backend.max_concurrency):
            continue  # a continuation does not queue
        base = (
            backend.engine_urls[0]
            if len(backend.engine_urls) == 1
            else gw.engine_table.pick(backend.engine_urls, x.affinity)
        )
        new_lease = Lease.begin(gw, record, name, base, backend.max_concurrency)
        try:
            new_resp, new_first = await open_engine(x, plan.body, backend, base, True)
        except UpstreamError as exc:
            gw.metrics.upstream_errors.labels(name, exc.kind).inc()
            new_lease.release(gw)
            if exc.accepted:
                return None  # that engine has the continuation: not sent again
            continue
        if x.resp is not None:
            x.resp.close()
        if x.lease is not None:
            x.lease.release(gw)
        x.resp, x.lease = new_resp, new_lease
        gw.metrics.upstream_errors.labels(failed, "midstream").inc()
        gw.live.failure(failed)
        gw.metrics.continuations.labels(record.route, failed, name).inc()
        record.backend, record.continued_from = name, failed
        filt.start_continuation(body)
        return new_resp, new_first
    return None
