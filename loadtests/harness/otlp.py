"""A small OTLP/HTTP receiver on loopback, for the tests and the overhead bench: what a gateway
exports (`--otlp-endpoint`), decoded with the protocol's own messages (opentelemetry-proto).

    with OtlpReceiver() as otlp:          # otlp.url: the gateway's --otlp-endpoint
        ...
        otlp.wait(lambda: otlp.spans_named("chat coder"))
        otlp.spans[0].attributes["gen_ai.request.model"]

No Collector: only the two export paths (`/v1/traces`, `/v1/metrics`), protobuf bodies, gzip or
not; anything else gets 404. `keep=False` counts what arrives and keeps nothing (the bench).

A collector that misbehaves, per path: `otlp.behaviour["/v1/traces"] = "hang"` reads each export
and then answers nothing until the receiver closes; "drip" answers a byte every 0.2 s; "503"
refuses it. `otlp.arrived` counts the exports each behaviour got.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue


def value_of(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [value_of(x) for x in v.array_value.values]
    if kind is None:
        return None
    return getattr(v, kind)


def attributes_of(kvs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in kvs if isinstance(kv, KeyValue)}


@dataclass
class Span:
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_span_id: str  # "" for a root span
    kind: int  # the protocol's SpanKind number (2: server)
    start_ns: int
    end_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    attributes: dict[str, Any]
    resource: dict[str, Any]


@dataclass
class HistogramPoint:
    attributes: dict[str, Any]
    count: int
    total: float
    bounds: list[float]
    bucket_counts: list[int]


@dataclass
class Metric:
    name: str
    unit: str
    points: list[HistogramPoint] = field(default_factory=list)  # histograms only


class OtlpReceiver:
    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.spans: list[Span] = []
        self.metrics: list[Metric] = []  # one per metric per export (cumulative)
        self.requests = 0
        self.span_count = 0
        self.bytes = 0  # export bodies as sent (compressed or not)
        self.behaviour: dict[str, str] = {}  # path -> "hang", "drip" or "503"; else answered
        self.arrived: dict[str, int] = {}  # behaviour -> exports it got
        self.closing = threading.Event()
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver._lock:
                    receiver.bytes += len(body)
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                if receiver._misbehaved(self.path, self.wfile):
                    self.close_connection = True
                    return
                if self.path == "/v1/traces":
                    receiver._traces(body)
                    answer = ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    receiver._metrics(body)
                    answer = ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.closing.set()  # hanging and dripping answers end
        self.server.shutdown()
        self.server.server_close()

    def _misbehaved(self, path: str, out: Any) -> bool:
        """Answer as `behaviour[path]` says; False: answer as a collector does."""
        how = self.behaviour.get(path)
        if how is None:
            return False
        with self._lock:
            self.arrived[how] = self.arrived.get(how, 0) + 1
        try:
            if how == "503":
                out.write(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n")
            elif how == "drip":
                for byte in b"HTTP/1.1 200 OK\r\n" + b"x-drip: " + b"." * 10_000:
                    out.write(bytes([byte]))
                    out.flush()
                    if self.closing.wait(0.2):
                        break
            else:
                self.closing.wait()
        except OSError:  # the exporter gave up and closed
            pass
        return True

    # --- what arrived -------------------------------------------------------------------------

    def _traces(self, body: bytes) -> None:
        req = ExportTraceServiceRequest.FromString(body)
        spans: list[Span] = []
        for rs in req.resource_spans:
            resource = attributes_of(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    spans.append(
                        Span(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            kind=s.kind,
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            status_code=s.status.code,
                            attributes=attributes_of(s.attributes),
                            resource=resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.span_count += len(spans)
            if self.keep:
                self.spans.extend(spans)

    def _metrics(self, body: bytes) -> None:
        req = ExportMetricsServiceRequest.FromString(body)
        out: list[Metric] = []
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    got = Metric(metric.name, metric.unit)
                    if metric.WhichOneof("data") == "histogram":
                        got.points = [
                            HistogramPoint(
                                attributes_of(p.attributes),
                                p.count,
                                p.sum,
                                list(p.explicit_bounds),
                                list(p.bucket_counts),
                            )
                            for p in metric.histogram.data_points
                        ]
                    out.append(got)
        with self._lock:
            self.requests += 1
            if self.keep:
                self.metrics.extend(out)

    def spans_named(self, name: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def latest(self, name: str) -> Metric | None:
        """The last export of metric `name` (cumulative: it holds every request so far)."""
        with self._lock:
            found = [m for m in self.metrics if m.name == name]
        return found[-1] if found else None

    def wait(self, ready: Callable[[], Any], timeout: float = 15.0) -> Any:
        """`ready()` once truthy, or raise after `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            got = ready()
            if got:
                return got
            if time.monotonic() > deadline:
                raise TimeoutError(f"OTLP receiver: nothing matched within {timeout:g} s")
            time.sleep(0.05)


def main() -> None:
    """`python -m loadtests.harness.otlp`: a receiver process that keeps nothing and prints a
    count line every 2 s (the overhead bench's collector), until SIGTERM."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with OtlpReceiver(keep=False) as receiver:
        print(f"otlp receiver on {receiver.url}", flush=True)
        while True:
            time.sleep(2.0)
            print(f"{receiver.requests} exports, {receiver.span_count} spans", flush=True)


if __name__ == "__main__":
    main()
