"""Every metric the gateway exports: names, types, labels and buckets, defined once.

Labels come only from closed sets (route, backend, client names from the policy; outcome and
kind from the enums below), never from raw request strings. Latency histograms are observed in
bulk when a request ends (see `GatewayMetrics.observe_request`), so the relay's per-chunk path
only appends to two lists.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Final, Protocol

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from proxy.observe.admission_metrics import AdmissionMetrics
from proxy.observe.backend_families import BACKEND_COUNTERS, BACKEND_GAUGES, BACKEND_PER_POS
from proxy.observe.labelled import Counter, Gauge  # children kept: labels() on the hot path
from proxy.record.measure import Measurement, TpsSource

# `_created` samples double the exposition and no dashboard reads them (vLLM runs without them
# too, in multiprocess mode).
disable_created_metrics()  # type: ignore[no-untyped-call]

OUTCOMES: Final = ("ok", "client_gone", "client_error", "upstream_error", "timeout", "rejected")

# Buckets sized for LLM traffic: TTFT up to minutes (100K-token prefills), ITL from 1 ms.
TTFT_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)
ITL_BUCKETS: Final = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    1,
    2.5,
)
STEP_BUCKETS: Final = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5, 1, 2.5)
TOKENS_PER_STEP_BUCKETS: Final = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
ACCEPTANCE_BUCKETS: Final = (1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5, 6, 7, 8)
PHASE_BUCKETS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2,
    5,
    10,
    30,
    60,
    120,
    300,
)
E2E_BUCKETS: Final = (0.1, 0.25, 0.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 120, 300, 600, 1800)


class FastHistogram(Collector):
    """A labelled histogram without locks, for code that runs on one event loop.

    prometheus_client's Histogram takes a lock and walks the buckets per sample; the gateway
    observes one ITL sample per generated token, so that cost is paid thousands of times a
    second. Exposition is the standard histogram family.
    """

    def __init__(self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]):
        self.name, self.doc, self.labels = name, doc, tuple(labels)
        self.bounds = tuple(float(b) for b in buckets)
        # label values -> [per-bucket counts (+Inf last), sum]
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def _get(self, key: tuple[str, ...]) -> tuple[list[int], list[float]]:
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = ([0] * (len(self.bounds) + 1), [0.0])
        return series

    def observe(self, key: tuple[str, ...], value: float) -> None:
        counts, total = self._get(key)
        counts[bisect_left(self.bounds, value)] += 1
        total[0] += value

    def observe_many(self, key: tuple[str, ...], values: Iterable[float]) -> None:
        counts, total = self._get(key)
        bounds = self.bounds
        acc = 0.0
        for v in values:
            counts[bisect_left(bounds, v)] += 1
            acc += v
        total[0] += acc

    def observe_weighted(
        self, key: tuple[str, ...], totals: Iterable[float], counts_of: Iterable[int]
    ) -> None:
        """`n` samples of `total / n` for each pair: a decode chunk of n tokens gives each of
        its tokens the same inter-token latency, without building the per-token list."""
        counts, total = self._get(key)
        bounds = self.bounds
        acc = 0.0
        for t, n in zip(totals, counts_of, strict=True):
            counts[bisect_left(bounds, t / n)] += n
            acc += t
        total[0] += acc

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for key, (counts, total) in list(self._series.items()):
            cumulative: list[tuple[str, float]] = []
            running = 0
            for bound, count in zip((*self.bounds, float("inf")), counts, strict=True):
                running += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), running))
            family.add_metric(list(key), cumulative, total[0])
        yield family


class GatewayMetrics:
    """The gateway's registry. One instance per app; tests make their own."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        rb = ("route", "backend")
        rbs = ("route", "backend", "source")  # source: measure.TpsSource
        self.requests = Counter(
            "specrouter_requests_total",
            "Requests finished, by outcome.",
            ("route", "backend", "client", "outcome"),
            registry=r,
        )
        self.ttft = FastHistogram(
            "specrouter_ttft_seconds",
            "Time to first token, streams only: request received to the "
            "relay of the first frame carrying a generated token (text, "
            "reasoning, tool-call arguments; not a role-only chunk, "
            "`response.created`, `message_start`, a ping or a comment). "
            "Non-streaming requests are in e2e only.",
            rb,
            TTFT_BUCKETS,
        )
        self.itl = FastHistogram(
            "specrouter_itl_seconds",
            "Inter-token latency, one sample per generated token: a decode "
            "chunk's gap over its tokens; on Responses/Messages streams "
            "(no per-event usage) the request average, decode time over "
            "output tokens - 1.",
            rb,
            ITL_BUCKETS,
        )
        self.step = FastHistogram(
            "specrouter_step_seconds",
            "Chunk gap: time between decode chunks (one target step), per chunk; not per token.",
            rb,
            STEP_BUCKETS,
        )
        self.tokens_per_step = FastHistogram(
            "specrouter_tokens_per_step",
            "Tokens per target step, per step: carried by one "
            "decode chunk (source=chunks), or the request "
            "average (source=average).",
            rbs,
            TOKENS_PER_STEP_BUCKETS,
        )
        self.acceptance = FastHistogram(
            "specrouter_request_acceptance_length",
            "Tokens per target step, per request: (output tokens - 1) / decode steps. "
            "source: engine (its report, the chunk count as a floor), chunks (one step "
            "per decode chunk), average (one step per token event after the first).",
            rbs,
            ACCEPTANCE_BUCKETS,
        )
        self.e2e = FastHistogram(
            "specrouter_e2e_seconds",
            "Request received to last byte (for every request, streaming or not).",
            rb,
            E2E_BUCKETS,
        )
        self.phases = FastHistogram(
            "specrouter_phase_seconds",
            "A response's time by phase, each from the end of the one "
            "before: gateway (before the engine was asked), "
            "engine_headers (to the engine's headers), first_token "
            "(streams), end (to the last byte); Server-Timing sends "
            "the first two.",
            ("route", "backend", "phase"),
            PHASE_BUCKETS,
        )
        for h in (
            self.ttft,
            self.itl,
            self.step,
            self.tokens_per_step,
            self.acceptance,
            self.e2e,
            self.phases,
        ):
            r.register(h)
        self.tokens = Counter(
            "specrouter_tokens_total",
            "Tokens by kind: prompt, cached (prompt tokens served from the "
            "prefix cache), completion.",
            ("route", "backend", "kind"),
            registry=r,
        )
        self.spec_steps = Counter(
            "specrouter_spec_steps_total",
            "Decode steps of requests with tokens per step measured (source as for acceptance).",
            rbs,
            registry=r,
        )
        self.spec_accepted = Counter(
            "specrouter_spec_accepted_tokens_total",
            "Accepted draft tokens that reached the answer: output tokens - 1 - decode steps.",
            rbs,
            registry=r,
        )
        self.in_flight = Gauge(
            "specrouter_in_flight", "Requests open to a backend.", rb, registry=r
        )
        self.queued = Gauge(
            "specrouter_queued",
            "Requests waiting for admission to a backend.",
            ("backend",),
            registry=r,
        )
        self.defaults_applied = Counter(
            "specrouter_defaults_applied_total",
            "Defaults injected because the client did not set them.",
            ("route", "field"),
            registry=r,
        )
        # proxy/relay/adapt.py: requests changed for an engine that refuses part of them.
        self.adaptations = Counter(
            "specrouter_adaptations_total",
            "Requests adapted for their engine by a named rule (proxy/relay/adapt.py: a part "
            "the engine refuses and the agent does not need, left out).",
            ("rule", "backend"),
            registry=r,
        )
        self.upstream_errors = Counter(
            "specrouter_upstream_errors_total",
            "Upstream failures: connect, status, timeout, midstream.",
            ("backend", "kind"),
            registry=r,
        )
        self.client_disconnects = Counter(
            "specrouter_client_disconnects_total",
            "Clients gone before the end of their response.",
            rb,
            registry=r,
        )
        self.decisions = Counter(
            "specrouter_decisions_total",
            "Policy decisions by chosen variant and deciding rule.",
            ("route", "variant", "reason"),
            registry=r,
        )
        self.rate_limited = Counter(
            "specrouter_rate_limited_total",
            "Requests refused with 429 by a client's limits.",
            ("client",),
            registry=r,
        )
        self.repairs = Counter(
            "specrouter_repairs_total",
            "Repair commands run for backends that stayed down, by result.",
            ("backend", "result"),
            registry=r,
        )
        self.continuations = Counter(
            "specrouter_continuations_total",
            "Streams finished by another variant after their engine died mid-stream.",
            ("route", "from_backend", "to_backend"),
            registry=r,
        )
        self.continuations_refused = Counter(
            "specrouter_continuations_refused_total",
            "Variants passed over for a continuation: another engine kind or other weights.",
            ("route", "from_backend", "to_backend", "reason"),
            registry=r,
        )
        self.retries = Counter(
            "specrouter_retries_total",
            "Requests sent to another backend before the first byte.",
            ("route", "backend"),
            registry=r,
        )
        # --redis-url: the session table shared by replicas (proxy/backends/session_share.py)
        self.session_share = Counter(
            "specrouter_session_share_rows_total",
            "Session rows sent to Redis, merged from other replicas, or dropped from a full queue.",
            # sent, merged, dropped, refused (a row not a count, or seen in the future), future
            # (index members trimmed: scored past Redis's clock, proxy/backends/session_share.py)
            ("result",),
            registry=r,
        )
        # --redis-url: the client limits shared by replicas (proxy/relay/limits.py)
        self.limits_errors = Counter(
            "specrouter_limits_redis_errors_total",
            "Failed Redis calls for the client limits: the replica then counts the limits "
            "itself (fail-over to local limits) and asks Redis again after 5 s.",
            ("op",),  # enter, leave
            registry=r,
        )
        # The request log (proxy/observe/requestlog.py): rows it could not keep, by why.
        self.requestlog_dropped = Counter(
            "specrouter_requestlog_dropped_total",
            "Request log rows not written: buffer_full (the database was slow or away too long), "
            "unreadable (a record that could not be read), unstorable (a value SQLite cannot "
            "hold). The rows of other requests in the same batch are written.",
            ("reason",),
            registry=r,
        )
        self.session_share_errors = Counter(
            "specrouter_session_share_errors_total",
            "Failed exchanges with Redis for the session table (the local table keeps serving).",
            # flush, pull, secret (the turn-state secret, proxy/relay/turnstate.py), and Redis
            # having lost it: secret-lost (this replica's put back), secret-changed (another taken)
            ("op",),
            registry=r,
        )

        self.sessions = AdmissionMetrics(r)  # session-aware admission

    def observe_request(
        self, route: str, backend: str, client: str, outcome: str, m: Measurement
    ) -> None:
        key = (route, backend)
        self.requests.labels(route, backend, client, outcome).inc()
        if m.ttft is not None:
            self.ttft.observe(key, m.ttft)
        if m.e2e is not None:
            self.e2e.observe(key, m.e2e)
        for phase, seconds in m.phases().items():
            self.phases.observe((route, backend, phase), seconds)
        gaps, tokens = m.itl_steps()
        if gaps:
            self.itl.observe_weighted(key, gaps, tokens)
        if m.step_gaps:
            self.step.observe_many(key, m.step_gaps)
            if m.estimate_void is None:  # chunks are steps (not llama.cpp's token frames)
                self.tokens_per_step.observe_many((route, backend, "chunks"), m.step_tokens)
        source = m.tps_source
        if source is not None:
            self._observe_tps(route, backend, source, m)
        if m.prompt_tokens:
            self.tokens.labels(route, backend, "prompt").inc(m.prompt_tokens)
        if m.cached_tokens:
            self.tokens.labels(route, backend, "cached").inc(m.cached_tokens)
        if m.completion_tokens:
            self.tokens.labels(route, backend, "completion").inc(m.completion_tokens)

    def _observe_tps(self, route: str, backend: str, source: TpsSource, m: Measurement) -> None:
        count = m.step_count
        if count is None:
            return
        if source == "average":
            # one sample per step of the request's mean, so sum / count stays tokens per step
            self.tokens_per_step.observe_weighted(
                (route, backend, source), (float(count.tokens),), (count.steps,)
            )
        self.acceptance.observe((route, backend, source), count.per_step)
        self.spec_accepted.labels(route, backend, source).inc(count.accepted)
        self.spec_steps.labels(route, backend, source).inc(count.steps)


BACKEND_UP: Final = ("specrouter_backend_up", "1 when the backend is up, 0 when down or starting.")


class BackendCollector(Collector):
    """Exposes the latest scrape of every backend with a `backend` label."""

    def __init__(self, latest: Callable[[], Mapping[str, BackendReading]]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Metric]:
        readings = self._latest()
        up = GaugeMetricFamily(BACKEND_UP[0], BACKEND_UP[1], labels=("backend", "health"))
        gauges = {
            k: GaugeMetricFamily(n, d, labels=("backend",)) for k, (n, d) in BACKEND_GAUGES.items()
        }
        counters = {
            k: CounterMetricFamily(n, d, labels=("backend",))
            for k, (n, d) in BACKEND_COUNTERS.items()
        }
        per_pos = CounterMetricFamily(
            BACKEND_PER_POS[0], BACKEND_PER_POS[1], labels=("backend", "position")
        )
        for name, reading in readings.items():
            up.add_metric([name, reading.health], 1.0 if reading.health == "up" else 0.0)
            for key, value in reading.values.items():
                if key in gauges:
                    gauges[key].add_metric([name], value)
                elif key in counters:
                    counters[key].add_metric([name], value)
            for pos, value in sorted(reading.accepted_per_pos.items()):
                per_pos.add_metric([name, str(pos)], value)
        yield up
        yield from gauges.values()
        yield from counters.values()
        yield per_pos


class BackendReading(Protocol):
    @property
    def health(self) -> str: ...
    @property
    def values(self) -> Mapping[str, float]: ...
    @property
    def accepted_per_pos(self) -> Mapping[int, float]: ...


def markdown_table() -> str:
    """docs/metrics.md's metrics table, generated from the definitions above (one source of truth)."""
    g = GatewayMetrics()
    lines = ["| name | type | labels | meaning |", "|---|---|---|---|"]
    for family in g.registry.collect():
        if family.name.startswith("specrouter_backend"):
            continue
        suffix = "_total" if family.type == "counter" else ""
        labels = _labels_of(g, family.name)
        lines.append(
            f"| `{family.name}{suffix}` | {family.type} | {', '.join(labels)} | "
            f"{family.documentation} |"
        )
    for name, doc in (BACKEND_UP, *BACKEND_GAUGES.values()):
        names = "backend, health" if name == BACKEND_UP[0] else "backend"
        lines.append(f"| `{name}` | gauge | {names} | {doc} |")
    for name, doc in (*BACKEND_COUNTERS.values(), BACKEND_PER_POS):
        names = "backend, position" if name == BACKEND_PER_POS[0] else "backend"
        lines.append(f"| `{name}_total` | counter | {names} | {doc} |")
    return "\n".join(lines)


def _labels_of(g: GatewayMetrics, name: str) -> list[str]:
    for value in (*vars(g).values(), *vars(g.sessions).values()):
        if isinstance(value, FastHistogram) and value.name == name:
            return list(value.labels)
        metric_name = getattr(value, "_name", None)
        if metric_name == name:
            return list(getattr(value, "_labelnames", ()))
    return []


if __name__ == "__main__":
    print(markdown_table())
