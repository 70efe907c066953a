"""`Services`: what the request path uses of the gateway's shared state, typed. The relay takes
one of these, not the gateway: proxy/gateway.py's `Gateway` is one (checked where it is passed),
a test may build a smaller one. Every member is read-only here: the path reads the services and
calls them, it never replaces one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy
    from proxy.backends.admission import Admission
    from proxy.backends.engines import EngineTable
    from proxy.backends.live import LiveTracker
    from proxy.backends.prefix import Baselines
    from proxy.backends.residency import Residency
    from proxy.backends.response_owners import ResponseOwners
    from proxy.backends.session_table import SessionTable
    from proxy.observe.metrics import GatewayMetrics
    from proxy.operator import Operator
    from proxy.record.request import RequestRecord
    from proxy.relay.deadlines import Deadlines
    from proxy.relay.engine_conn import EnginePool
    from proxy.relay.limits import Limits
    from proxy.relay.turnstate import TurnState
    from proxy.relay.upstream import Upstream
    from proxy.relay.watch import DisconnectWatch
    from proxy.settings import Settings


class Policies(Protocol):
    """The current compiled policy: a request reads `current` once, when it arrives."""

    @property
    def current(self) -> CompiledPolicy: ...


class Services(Protocol):
    @property
    def settings(self) -> Settings: ...
    @property
    def operator(self) -> Operator: ...
    @property
    def policy(self) -> Policies: ...
    @property
    def metrics(self) -> GatewayMetrics: ...
    @property
    def live(self) -> LiveTracker: ...  # each backend's health, as the health checks see it
    @property
    def engine_table(self) -> EngineTable: ...  # several engines per variant
    @property
    def admission(self) -> Admission: ...  # per-backend concurrency queues
    @property
    def sessions(self) -> SessionTable: ...
    @property
    def residency(self) -> Residency: ...  # session-aware admission's state
    @property
    def kv_reported(self) -> dict[str, int]: ...  # each engine's KV tokens, as it reports them
    @property
    def prefixes(self) -> Baselines: ...  # each session's previous turn
    @property
    def response_owners(self) -> ResponseOwners: ...
    @property
    def limits(self) -> Limits: ...  # client rate limits
    @property
    def turn_state(self) -> TurnState: ...
    @property
    def upstream(self) -> Upstream: ...  # the pull relay's aiohttp client
    @property
    def conns(self) -> EnginePool: ...  # the push relay's kept-alive engine connections
    @property
    def first_byte(self) -> Deadlines: ...  # the push relay's first-byte timeouts
    @property
    def last_write(self) -> Deadlines: ...  # a stream's last event to a paused client
    @property
    def in_flight(self) -> dict[int, RequestRecord]: ...
    @property
    def watches(self) -> dict[int, DisconnectWatch]: ...
    @property
    def draining(self) -> bool: ...
    @property
    def begin(self) -> Callable[[RequestRecord, dict[bytes, bytes]], None] | None: ...

    def kv_deployed(self, policy: CompiledPolicy) -> dict[str, int]: ...

    def finished(self, record: RequestRecord) -> None:
        """Hands a finished request's record to the sinks (log, dashboard, sessions)."""
