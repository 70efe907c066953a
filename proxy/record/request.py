"""`RequestRecord`: one request from arrival to its last byte, built by the request path and
handed to the gateway's sinks (the request log, metrics, the dashboard's timeline)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from policies.agent_signals import NONE, AgentSignals
from proxy.backends.prefix import NOTHING, Check, PrefixLoss
from proxy.record.measure import Measurement


@dataclass(slots=True)
class RequestRecord:
    """One request, from arrival to its last byte; what the log, metrics and dashboard see."""

    request_id: str
    client: str
    endpoint: str
    route: str = ""
    backend: str = ""
    reason: str = ""
    canary: bool = False
    content_class: str | None = None
    defaults_applied: tuple[str, ...] = ()
    temperature: float | None = None  # effective: the client's or the injected default
    temperature_defaulted: bool = False
    stream: bool = False
    status: int = 0
    outcome: str = "ok"
    retries: int = 0
    continued_from: str = ""  # the backend whose engine died, when continued
    concurrency: int = 0  # requests open on the serving backend when this one started, itself too
    policy_version: str = ""
    session: str = ""  # the session key (policies/sessions.py), a hash: never the raw id
    agent: str = ""  # the agent program (claude-code, codex, ...), "/subagent" for a subagent
    subagent: bool = False
    # The agent's own signals (policies/agent_signals.py), bounded: its request class, agent
    # type, compaction, hashed prompt and turn ids. A class records; it grants nothing.
    signals: AgentSignals = NONE
    turn_state: str = ""  # "" | issued | valid | refused: the x-codex-turn-state token's fate
    adapted: tuple[str, ...] = ()  # proxy/relay/adapt.py: the rules that changed the request
    # A session turn's conversation against its previous turn's (proxy/backends/prefix.py),
    # and once it ended, the prefix tokens it lost and why.
    prefix_check: Check | None = None
    prefix: PrefixLoss = NOTHING
    model: str = ""  # as the client named it
    # OpenTelemetry, when on (proxy/observe/otel.py): the request's open span, and the
    # `traceparent` that carries its context to the engines ("" when off: the client's goes).
    span: Any = None
    traceparent: str = ""
    # What the path met on its way, counted once the request ended (proxy/observe/metrics.py,
    # `Metrics.observe_record`); tuples, so a request that meets nothing allocates nothing.
    decided: str = ""  # the backend the policy decided (`backend` is the one that answered)
    upstream_errors: tuple[tuple[str, str], ...] = ()  # (backend, kind) of each failure
    retried_to: tuple[str, ...] = ()  # the backend each retry before the first byte went to
    adaptations: tuple[tuple[str, str], ...] = ()  # (rule, backend) on every attempt
    continuations: tuple[tuple[str, str], ...] = ()  # (failed, finished by)
    continuations_refused: tuple[tuple[str, str, str], ...] = ()  # (failed, variant, why)
    started_wall: float = field(default_factory=time.time)
    m: Measurement = field(default_factory=lambda: Measurement(time.perf_counter()))

    @property
    def continued(self) -> bool:
        """Finished by another variant after its engine died mid-stream."""
        return self.continued_from != ""
