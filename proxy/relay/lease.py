"""`Lease`: one request's hold on one engine (admission slot, in-flight counts, gauges), taken
by proxy/relay/forward.py, for an attempt and for a continuation."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.record.request import RequestRecord
    from proxy.relay.context import Services


class Lease:
    """One request's hold on one engine: admission slot, in-flight counts, gauges."""

    __slots__ = ("backend", "base", "limit", "route")

    def __init__(self, backend: str, base: str, limit: int, route: str) -> None:
        self.backend, self.base, self.limit, self.route = backend, base, limit, route

    @classmethod
    def begin(
        cls, gw: Services, record: RequestRecord, backend: str, base: str, limit: int
    ) -> Lease:
        """The admission slot is already held; count the request everywhere else."""
        gw.live.begin(backend)
        gw.engine_table.state(base).in_flight += 1
        record.concurrency = gw.live.get(backend).in_flight
        gw.metrics.in_flight.labels(record.route, backend).inc()
        return cls(backend, base, limit, record.route)

    def release(self, gw: Services) -> None:
        gw.live.end(self.backend)
        gw.engine_table.state(self.base).in_flight -= 1
        gw.metrics.in_flight.labels(self.route, self.backend).dec()
        gw.admission.release(self.backend, self.limit)
