"""Session-aware admission's metrics (policies/admission.py) and the sessions' lost prefixes
(proxy/backends/prefix.py), part of the gateway's registry (proxy/observe/metrics.py's
`GatewayMetrics.sessions`): every name defined here, once."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Histogram

from proxy.observe.labelled import Counter, Gauge

# A held turn's wait: seconds to an hour (a session may wait max_wait_s and more).
WAIT_BUCKETS: Final = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 240, 300, 600, 900, 1800, 3600)
# How a held turn's wait ended.
WAIT_OUTCOMES: Final = ("admitted", "moved", "timeout", "client_gone", "released")


class AdmissionMetrics:
    def __init__(self, r: CollectorRegistry) -> None:
        self.turns = Counter(
            "specrouter_session_admission",
            "Session turns decided by session-aware admission, by verdict (admit, wait) and "
            "reason (policies/admission.py).",
            ("backend", "verdict", "reason"),
            registry=r,
        )
        self.waits = Counter(
            "specrouter_session_waits",
            "Held session turns, by how their wait ended: admitted, moved (another engine "
            "paid), timeout, client_gone, released (admission turned off by a policy).",
            ("backend", "outcome"),
            registry=r,
        )
        self.wait_s = Histogram(
            "specrouter_session_wait_seconds",
            "How long held session turns waited for admission.",
            ("backend",),
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.waiting = Gauge(
            "specrouter_session_waiting",
            "Session turns held now, waiting for their engine.",
            ("backend",),
            registry=r,
        )
        self.resident = Gauge(
            "specrouter_session_resident",
            "Sessions resident on a backend (their prefixes kept) and the KV tokens they hold.",
            ("backend", "what"),  # sessions, tokens
            registry=r,
        )
        self.prefix_lost = Counter(
            "specrouter_prefix_lost_tokens",
            "Prompt tokens a session's turn found uncached of those its engine held after the "
            "session's previous turn (whole blocks), by cause: client-rewrite, compacted, "
            "evicted, engine-rendering, engine-reset (the engine's KV events), unknown "
            "(proxy/backends/prefix.py).",
            ("backend", "cause"),
            registry=r,
        )
        self.kv_events = Counter(
            "specrouter_kv_events",
            "vLLM KV event batches a backend's subscriber read (proxy/backends/kv_subscriber.py), "
            "by what: applied, gap (a replay asked), lost (a gap no replay filled: the index began again), "
            "restart (the engine's sequence began again), bad (not vLLM's wire).",
            ("backend", "what"),
            registry=r,
        )
