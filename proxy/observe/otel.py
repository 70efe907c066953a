"""OpenTelemetry: one GenAI span per request and the GenAI metrics, over OTLP/HTTP (off unless
`--otlp-endpoint` is set; proxy/serve.py wires it).

The span is opened when the request is decided (`begin`: parented to the client's `traceparent`,
whose context the engine request then carries) and closed where the request is finished and
recorded (`sink`, one of the gateway's sinks, as the request log's): its attributes and the metrics
come from the figures already measured, nothing is added to the per-chunk path. Export runs in the
SDK's batch processor and periodic reader threads, bounded queues, off the event loop: a
collector that is down or slow drops telemetry, never a request. What is queued is bounded
too: span names and metric attributes from a closed set, span attributes cut
(proxy/observe/genai.py), at most MAX_QUEUED_SPANS spans waiting, EXPORT_BATCH_SPANS a request.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from proxy.observe import genai

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy
    from proxy.gateway import PolicyHolder
    from proxy.record.request import RequestRecord

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
SCOPE = "specrouter"
# Exports give up after this: a slow collector delays the export threads, never the loop.
EXPORT_TIMEOUT_S = 5.0
# At exit, what is pending gets this long to leave (a live collector takes milliseconds).
SHUTDOWN_S = 2.0
# Spans waiting for export (more are dropped, counted by the SDK), and spans per export request:
# with attributes cut at genai.MAX_ATTRIBUTE_CHARS, a few MB at most.
MAX_QUEUED_SPANS = 2048
EXPORT_BATCH_SPANS = 512


def views() -> list[View]:
    """Every histogram's explicit buckets (proxy/observe/genai.py): the SDK's defaults end at
    10 s, where a long prefill's first token has not come yet."""
    return [
        View(
            instrument_name=i.name,
            aggregation=ExplicitBucketHistogramAggregation(boundaries=i.buckets),
        )
        for i in genai.INSTRUMENTS
    ]


class Telemetry:
    """The providers, exporters and instruments of one gateway process."""

    def __init__(
        self,
        endpoint: str,
        policy: PolicyHolder,
        *,
        metrics_interval_s: float = 10.0,
        resource: Resource | None = None,
    ) -> None:
        base = endpoint.rstrip("/")
        self.policy = policy
        self.resource = resource or Resource.create({"service.name": "specrouter"})
        # shutdown_on_exit=False: `shutdown` is ours, bounded; an exit hook would wait on a dead
        # collector for the exporter's full retry time.
        self.tracer_provider = TracerProvider(
            resource=self.resource,
            shutdown_on_exit=False,
            span_limits=SpanLimits(max_attribute_length=genai.MAX_ATTRIBUTE_CHARS),
        )
        self.tracer_provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=base + "/v1/traces", timeout=EXPORT_TIMEOUT_S),
                max_queue_size=MAX_QUEUED_SPANS,
                max_export_batch_size=EXPORT_BATCH_SPANS,
            )
        )
        reader = PeriodicExportingMetricReader(
            OTLPMetricExporter(endpoint=base + "/v1/metrics", timeout=EXPORT_TIMEOUT_S),
            export_interval_millis=metrics_interval_s * 1000,
            export_timeout_millis=EXPORT_TIMEOUT_S * 1000,
        )
        self.meter_provider = MeterProvider(
            metric_readers=[reader],
            resource=self.resource,
            views=views(),
            shutdown_on_exit=False,
        )
        self.tracer = self.tracer_provider.get_tracer(SCOPE)
        meter = self.meter_provider.get_meter(SCOPE)
        self.histograms = {
            i.name: meter.create_histogram(i.name, unit=i.unit, description=i.description)
            for i in genai.INSTRUMENTS
        }
        self.shutdown_s = SHUTDOWN_S
        self.failures = 0  # records whose span or metrics could not be built (logged once)

    # --- the request path -------------------------------------------------------------------

    def begin(self, record: RequestRecord, headers: dict[bytes, bytes]) -> None:
        """Open the request's span under the client's `traceparent`, if any, from its arrival;
        `record.traceparent` is then what the engines get."""
        carrier = {
            k: headers[b].decode("latin-1")
            for k, b in (("traceparent", b"traceparent"), ("tracestate", b"tracestate"))
            if b in headers
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        age_ns = int((time.perf_counter() - record.m.t_start) * 1e9)
        span = self.tracer.start_span(
            genai.operation(record),  # named once decided (`_finished`): never the raw model
            context=parent,
            kind=SpanKind.SERVER,
            start_time=time.time_ns() - age_ns,
        )
        out: dict[str, str] = {}
        _PROPAGATOR.inject(out, context=trace.set_span_in_context(span))
        record.span, record.traceparent = span, out.get("traceparent", "")

    def sink(self, record: RequestRecord) -> None:
        """The request is finished: its span's attributes and end, its metrics. Never raises."""
        try:
            self._finished(record)
        except Exception:  # telemetry must never fail the request that feeds it
            self.failures += 1
            if self.failures == 1:
                log.exception("OpenTelemetry: a finished request could not be recorded")

    def _finished(self, record: RequestRecord) -> None:
        m, span = record.m, record.span
        provider, served = self._backend(record.backend)
        if span is not None and span.is_recording():  # not when the client's trace is unsampled
            span.update_name(genai.span_name(record))
            span.set_attributes(genai.span_attributes(record, provider, served))
            if genai.is_error(record):
                span.set_status(Status(StatusCode.ERROR, record.outcome))
            start_ns: int = span.start_time or time.time_ns()
            span.end(end_time=start_ns + int((m.e2e or 0.0) * 1e9))
        attrs = genai.metric_attributes(record, provider)
        h = self.histograms
        if m.e2e is not None:
            h[genai.SERVER_REQUEST_DURATION].record(m.e2e, attrs)
        if m.ttft is not None:
            h[genai.SERVER_TTFT].record(m.ttft, attrs)
        per_token = genai.server_time_per_output_token(record)
        if per_token is not None:
            h[genai.SERVER_TIME_PER_OUTPUT_TOKEN].record(per_token, attrs)
        if m.t_engine is None:
            return  # no engine was asked: nothing toward the engines
        if m.t_end is not None:
            h[genai.CLIENT_DURATION].record(m.t_end - m.t_engine, attrs)
        if m.stream and m.t_first_byte is not None:
            h[genai.CLIENT_TTFC].record(m.t_first_byte - m.t_engine, attrs)
        per_chunk = genai.client_time_per_output_chunk(record)
        if per_chunk is not None:
            h[genai.CLIENT_TIME_PER_OUTPUT_CHUNK].record(per_chunk, attrs)
        usage = h[genai.CLIENT_TOKEN_USAGE]
        for kind, count in zip(
            genai.TOKEN_TYPES, (m.prompt_tokens, m.completion_tokens, m.cached_tokens), strict=True
        ):
            if count is not None:
                usage.record(count, {**attrs, "gen_ai.token.type": kind})

    def _backend(self, name: str) -> tuple[str | None, str | None]:
        """(engine kind, served model name) of a backend of the current policy."""
        policy: CompiledPolicy = self.policy.current
        try:
            spec = policy.backend(name)
        except KeyError:
            return None, None
        return str(spec.kind), spec.served_model_name

    # --- lifecycle --------------------------------------------------------------------------

    def flush(self, timeout_s: float = EXPORT_TIMEOUT_S) -> None:
        """Export what is pending now (blocking: call it from a thread)."""
        ms = int(timeout_s * 1000)
        self.tracer_provider.force_flush(ms)
        self.meter_provider.force_flush(ms)

    def shutdown(self) -> None:
        """Export what is pending, then stop the export threads (blocking: from a thread)."""
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown(timeout_millis=EXPORT_TIMEOUT_S * 1000)
