"""The gateway's runtime: one container built at startup and passed to the apps.

No module-level state: tests build as many gateways as they like, each with its own
registry, session, policy and live state.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from proxy.backends.admission import Admission
from proxy.backends.attained import served_tokens
from proxy.backends.engines import EngineTable
from proxy.backends.kv_engines import KvEngines
from proxy.backends.kv_index import Residency as KvResidency
from proxy.backends.live import LiveTracker
from proxy.backends.prefix import DEFAULT_BLOCK, Baselines
from proxy.backends.residency import Residency
from proxy.backends.residency_share import ResidencyShare
from proxy.backends.response_owners import ResponseOwners
from proxy.backends.session_share import SessionShare
from proxy.backends.session_table import SessionTable
from proxy.observe.events import EventLog
from proxy.observe.metrics import GatewayMetrics
from proxy.observe.timeline import Timeline
from proxy.operator import Operator
from proxy.record.request import RequestRecord
from proxy.relay.deadlines import Deadlines
from proxy.relay.engine_conn import EnginePool
from proxy.relay.limits import Limits, MemoryLimits, RedisLimits
from proxy.relay.turnstate import TurnState
from proxy.relay.upstream import Upstream
from proxy.relay.watch import DisconnectWatch
from proxy.settings import Settings

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy
    from policies.spec.context import ValidationContext
    from policies.spec.document import PolicyDocument


Sink = Callable[[RequestRecord], None]
# Called when a request is decided, with its headers (proxy/observe/otel.py's `begin`).
Begin = Callable[[RequestRecord, dict[bytes, bytes]], None]


class PolicyHolder:
    """The current compiled policy. Applying a new one is a single reference swap: a request
    reads `current` once when it arrives and finishes under that policy."""

    def __init__(self, policy: CompiledPolicy, context: ValidationContext) -> None:
        self.current = policy
        self.context = context  # what a new policy is validated against


class Gateway:
    def __init__(
        self, settings: Settings, policy: CompiledPolicy, operator: Operator | None = None
    ) -> None:
        self.settings = settings
        # Without an operator file: no actions, no secrets, loopback engines only.
        self.operator = operator or Operator()
        self.policy = PolicyHolder(policy, self.operator.context)
        self.metrics = GatewayMetrics()
        self.live = LiveTracker()
        self.sessions = SessionTable(policy.sessions.table_size, policy.sessions.idle_s)
        self.admission = Admission()
        # Session-aware admission's state (proxy/relay/hold.py), and the KV tokens each engine
        # reports (vLLM's cache_config_info, proxy/backends/health.py).
        self.residency = Residency(self._resident_gauges)
        self.kv_reported: dict[str, int] = {}
        self.kv_block: dict[str, int] = {}  # ... and their KV block size
        # Each session's previous turn: what its next one should find cached (per-turn loss)
        # ... told apart by the engines' KV events where the policy subscribes to them
        self.kv_engines = KvEngines(self.metrics.sessions.kv_events)
        self._kv_version = ""
        self.prefixes = Baselines(residency=self._kv_residency)
        # ... which also give the stickiness arithmetic and admission each session's prefix
        self.sessions.measured = self.residency.measured = self.kv_resident_tokens
        # ... and the deployed budget's (`deploy render`'s memory model), per policy version:
        # serve.py sets `kv_of`, the request path does not import the operator tools.
        self.kv_of: Callable[[PolicyDocument], dict[str, int]] = lambda doc: {}
        self._kv_deployed: tuple[str, dict[str, int]] = ("", {})
        self.engine_table = EngineTable()
        self.limits: Limits = (
            RedisLimits(settings.redis_url, settings.redis_prefix, self.metrics.limits_errors)
            if settings.redis_url
            else MemoryLimits()
        )
        self.turn_state = TurnState.from_settings(
            settings.turn_state_secret, shared=settings.redis_url is not None
        )
        # Replicas share the session table through Redis, off the request path (`start`), and
        # the turn-state secret when none is configured.
        self.share = (
            SessionShare(
                self.sessions,
                settings,
                self.metrics,
                turn_state=None if self.turn_state.secret is not None else self.turn_state,
                known_client=lambda name: self.policy.current.client(name) is not None,
            )
            if settings.redis_url
            else None
        )
        # ... and session-aware admission's residency (proxy/backends/residency_share.py)
        self.residency_share = (
            ResidencyShare(self.residency, settings, self.metrics, self.share.replica)
            if self.share is not None
            else None
        )
        self.upstream = Upstream(
            connect_timeout=settings.connect_timeout_s,
            first_byte_timeout=settings.first_byte_timeout_s,
            max_head_bytes=settings.max_engine_header_bytes,
        )
        # the push relay's kept-alive engine connections
        self.conns = EnginePool(max_head_bytes=settings.max_engine_header_bytes)
        self.first_byte = Deadlines(settings.first_byte_timeout_s)
        self.last_write = Deadlines(settings.client_write_timeout_s)
        self.in_flight: dict[int, RequestRecord] = {}  # by id(record): ids repeat in headers
        self.watches: dict[int, DisconnectWatch] = {}  # same keys: to end streams at shutdown
        self.draining = False
        self.recent: deque[RequestRecord] = deque(maxlen=200)
        self.events = EventLog()  # health transitions, repairs, policy changes (bounded)
        self.timeline = Timeline()  # the dashboard's charts: 15 minutes of 10 s aggregates
        self.response_owners = ResponseOwners()  # previous_response_id: the creator's only
        self.sinks: list[Sink] = [
            self.recent.append,
            self._session_turn,
            self.timeline.add,
            self._response_owner,
        ]
        self.begin: Begin | None = None  # set with a tracing sink (proxy/serve.py)

    def kv_deployed(self, policy: CompiledPolicy) -> dict[str, int]:
        """Each backend's KV tokens as deployed, computed once per policy version."""
        if self._kv_deployed[0] != policy.version:
            self._kv_deployed = (policy.version, self.kv_of(policy.document))
        return self._kv_deployed[1]

    def _kv_residency(self, engine: str, session: str) -> KvResidency | None:
        policy = self.policy.current
        if policy.version != self._kv_version:  # a policy applied since: follow its backends
            self._kv_version = policy.version
            self.kv_engines.sync(policy.document)
        return self.kv_engines.residency(engine, session)

    def kv_resident_tokens(self, engine: str, session: str) -> int | None:
        """The session's prefix the engine holds now, from its KV events; None where the
        policy subscribes to none for it or they name none of the session's blocks."""
        found = self._kv_residency(engine, session)
        return None if found is None or not found.block_size else found.tokens

    def _resident_gauges(self, backend: str, sessions: int, tokens: int) -> None:
        gauge = self.metrics.sessions.resident
        gauge.labels(backend, "sessions").set(sessions)
        gauge.labels(backend, "tokens").set(tokens)

    def finished(self, record: RequestRecord) -> None:
        for sink in self.sinks:
            sink(record)

    def _response_owner(self, record: RequestRecord) -> None:
        if record.m.response_id is not None and record.outcome == "ok":
            self.response_owners.note(record.m.response_id, record.client)

    def _session_turn(self, record: RequestRecord) -> None:
        # The conversation's bytes stay with the record no longer than this (`recent` keeps it)
        check, record.prefix_check = record.prefix_check, None
        if not record.session or record.outcome != "ok":
            return
        m = record.m
        now = time.perf_counter()
        # Every request of the session counts in its attained service (policies/fairness.py)
        served = served_tokens(m.prompt_tokens, m.cached_tokens, m.completion_tokens)
        self.sessions.served(record.session, served, now)
        # A compaction or auxiliary request is not the session's turn (policies/agent_signals.py)
        if record.signals.keeps_place:
            if record.signals.request_class == "compaction":
                self.prefixes.compacted(record.session)
            return
        if check is not None:
            record.prefix = loss = self.prefixes.finished(
                record.session,
                check,
                record.backend,
                m.prompt_tokens,
                m.cached_tokens,
                block=self.kv_block.get(record.backend, DEFAULT_BLOCK),
                compacted=record.signals.context_compacted is True,
            )
            if loss.lost:
                self.metrics.sessions.prefix_lost.labels(record.backend, loss.cause).inc(loss.lost)
                self.sessions.lost(record.session, loss.lost, loss.cause, loss.where)
        decode = (
            m.t_last_token - m.t_first_token
            if m.t_last_token is not None and m.t_first_token is not None
            else 0.0
        )
        self.sessions.finished(
            record.session,
            record.backend,
            now,
            prompt_tokens=m.prompt_tokens,
            completion_tokens=m.completion_tokens,
            cached_tokens=m.cached_tokens,
            decode_s=decode,
        )

    def start(self) -> None:
        """The background work that needs the running loop."""
        self._kv_version = self.policy.current.version
        self.kv_engines.sync(self.policy.current.document)
        if self.share is not None:
            self.share.start()
        if self.residency_share is not None:
            self.residency_share.start()

    async def aclose(self) -> None:
        self.kv_engines.close()
        if self.share is not None:
            await self.share.aclose()
        if self.residency_share is not None:
            await self.residency_share.aclose()
        self.conns.close()
        self.first_byte.close()
        self.last_write.close()
        await self.upstream.aclose()
        await self.limits.aclose()
