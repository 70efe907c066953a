"""A finished request's counters and histograms, all written from its record
(proxy/record/request.py) once it ended; the gauges stay with the owners of their state."""

from __future__ import annotations

from proxy.observe.metrics import GatewayMetrics
from proxy.record.request import RequestRecord


def observe_record(metrics: GatewayMetrics, r: RequestRecord) -> None:
    """A finished request's counters and histograms, all from its record."""
    if r.decided:
        metrics.decisions.labels(r.route, r.decided, r.reason).inc()
        for name in r.defaults_applied:
            metrics.defaults_applied.labels(r.route, name).inc()
    for backend, kind in r.upstream_errors:
        metrics.upstream_errors.labels(backend, kind).inc()
    for backend in r.retried_to:
        metrics.retries.labels(r.route, backend).inc()
    for rule, backend in r.adaptations:
        metrics.adaptations.labels(rule, backend).inc()
    for failed, backend in r.continuations:
        metrics.continuations.labels(r.route, failed, backend).inc()
    for failed, backend, why in r.continuations_refused:
        metrics.continuations_refused.labels(r.route, failed, backend, why).inc()
    if r.outcome == "client_gone" and r.backend:
        metrics.client_disconnects.labels(r.route, r.backend).inc()
    metrics.observe_request(r.route, r.backend or "none", r.client, r.outcome, r.m)
