"""OpenTelemetry GenAI through a real gateway (`specrouter serve --otlp-endpoint`) in front of
the simulator, exported over real OTLP/HTTP into a receiver on loopback that decodes the protocol
(loadtests/harness/otlp.py): one span per request whose figures are the request log row's,
parented to the client's `traceparent` and parenting the engine's; the GenAI metrics' names,
units and TTFT buckets past 60 s. Off by default: no `traceparent` made up for the engines. A
client's model names, however long or many, never become span names or metric series. A
collector that refuses, hangs, drips or is gone fails no request."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.otlp import OtlpReceiver, Span
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer
from proxy.observe import genai
from proxy.settings import Settings

SERVED = "qwen3.8-27b"
ASK = [{"role": "user", "content": "Write a function that parses `src/app/main.py`."}]
# Spans leave the gateway 0.1 s after they end instead of 5 s (the SDK's batch delay).
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "100"}
SERVER_KIND = 2  # the protocol's SPAN_KIND_SERVER


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(
        "mtp3",
        served_model_name=SERVED,
        time_scale=0.02,
        extra_args=["--enable-prompt-tokens-details"],  # cached tokens reported, as on the GB10
    ) as server:
        yield server


@pytest.fixture(scope="module")
def traced(certs: Any, sim: SimServer) -> Iterator[tuple[GatewayServer, OtlpReceiver]]:
    policy = coder_policy({"coder-a": sim.url}, served=SERVED)
    with OtlpReceiver() as otlp, mock.patch.dict(os.environ, FAST_EXPORT):
        args = ("--otlp-endpoint", otlp.url, "--otlp-metrics-interval", "0.3")
        with GatewayServer(policy, certs=certs, args=args) as gw:
            yield gw, otlp


def _traceparent() -> tuple[str, str, str]:
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, parent, f"00-{trace_id}-{parent}-01"


def _stream(gw: GatewayServer, path: str, body: dict[str, Any], headers: dict[str, str]) -> None:
    with gw.client() as c, c.stream("POST", path, json=body, headers=headers) as r:
        assert r.status_code == 200, r.read()
        raw = b"".join(r.iter_raw())
    assert raw.endswith(b"\n\n") and b"error" not in raw


def _span_of(otlp: OtlpReceiver, rid: str) -> Span:
    def found() -> list[Span]:
        return [
            s
            for s in otlp.spans_named("chat coder")
            if s.attributes["specrouter.request_id"] == rid
        ]

    spans = otlp.wait(found)
    assert len(spans) == 1, "one span per request"
    return spans[0]


def test_span_per_request_is_the_log_row_under_the_clients_trace(
    traced: tuple[GatewayServer, OtlpReceiver], sim: SimServer
) -> None:
    gw, otlp = traced
    requests = {
        "otel-chat": (
            "/v1/chat/completions",
            {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 24},
        ),
        "otel-messages": (
            "/v1/messages",
            {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 24},
        ),
    }
    parents: dict[str, tuple[str, str]] = {}
    for rid, (path, body) in requests.items():
        trace_id, parent, header = _traceparent()
        parents[rid] = (trace_id, parent)
        _stream(
            gw,
            path,
            body,
            {"x-request-id": rid, "traceparent": header, "x-claude-code-session-id": "s-" + rid},
        )
    rows = logged_rows(gw.dir / "state", set(requests))
    seen_by_engine = sim.traceparents()
    for rid, row in rows.items():
        span = _span_of(otlp, rid)
        a = span.attributes
        trace_id, parent = parents[rid]
        assert (span.trace_id, span.parent_span_id, span.kind) == (trace_id, parent, SERVER_KIND)
        # the engine's request carries the gateway's span as its parent, in the client's trace
        assert seen_by_engine[rid] == f"00-{trace_id}-{span.span_id}-01"
        assert a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.request.model"] == "coder"
        assert a["gen_ai.response.model"] == SERVED
        assert a["gen_ai.provider.name"] == "vllm"
        assert a["gen_ai.request.stream"] is True
        assert a["http.response.status_code"] == 200
        same = {
            "specrouter.route": "route",
            "specrouter.variant": "variant",
            "specrouter.reason": "reason",
            "specrouter.outcome": "outcome",
            "specrouter.agent": "agent",
            "gen_ai.conversation.id": "session",
            "gen_ai.usage.input_tokens": "prompt_tokens",
            "gen_ai.usage.output_tokens": "completion_tokens",
            "gen_ai.usage.cache_read.input_tokens": "cached_tokens",
            "specrouter.ttft_s": "ttft_s",
            "specrouter.e2e_s": "e2e_s",
            "specrouter.tokens_per_step": "tokens_per_step",
            "specrouter.tps_source": "tps_source",
            "specrouter.finish_reason": "finish_reason",
            "specrouter.phase.gateway_s": "gateway_s",
            "specrouter.phase.engine_headers_s": "engine_headers_s",
        }
        for attr, column in same.items():
            assert a.get(attr) == row[column], (rid, attr, column)
        for column in ("ttft_s", "tokens_per_step", "prompt_tokens", "session"):
            assert row[column], (rid, column)  # each compared figure is a real one
        assert row["cached_tokens"] is not None
        assert row["agent"] == "claude-code" and row["outcome"] == "ok"
        assert a["gen_ai.response.finish_reasons"] == [row["finish_reason"]]
        assert span.end_ns - span.start_ns == pytest.approx(row["e2e_s"] * 1e9, abs=1e3)
        assert span.resource["service.name"] == "specrouter"


def test_genai_metrics_names_units_and_buckets(
    traced: tuple[GatewayServer, OtlpReceiver],
) -> None:
    gw, otlp = traced
    _stream(
        gw,
        "/v1/chat/completions",
        {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 16},
        {"x-request-id": "otel-metrics"},
    )
    units = {i.name: i.unit for i in genai.INSTRUMENTS}
    assert set(units) == {
        "gen_ai.server.request.duration",
        "gen_ai.server.time_to_first_token",
        "gen_ai.server.time_per_output_token",
        "gen_ai.client.inference.duration",
        "gen_ai.client.inference.time_to_first_chunk",
        "gen_ai.client.inference.time_per_output_chunk",
        "gen_ai.client.token.usage",
    }
    for name, unit in units.items():
        metric = otlp.wait(lambda name=name: otlp.latest(name))
        assert metric.unit == unit, name
        assert metric.points and all(p.count > 0 for p in metric.points), name
        point = metric.points[0]
        assert point.attributes["gen_ai.operation.name"] == "chat", name
        assert point.attributes["gen_ai.request.model"] == "coder", name
        assert "specrouter.route" in point.attributes, name
        assert "gen_ai.conversation.id" not in point.attributes, "unbounded: spans only"
        assert len(point.bucket_counts) == len(point.bounds) + 1
    for name in (
        "gen_ai.server.time_to_first_token",
        "gen_ai.client.inference.time_to_first_chunk",
    ):
        metric = otlp.latest(name)
        assert metric is not None and max(metric.points[0].bounds) > 60.0, "long prefills"
    usage = otlp.latest("gen_ai.client.token.usage")
    assert usage is not None
    assert {p.attributes["gen_ai.token.type"] for p in usage.points} == {
        "input",
        "output",
        "cache_read",
    }


def test_off_by_default_no_traceparent_made_up(certs: Any, sim: SimServer) -> None:
    assert Settings().otlp_endpoint is None
    with GatewayServer(coder_policy({"coder-a": sim.url}, served=SERVED), certs=certs) as gw:
        body = {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 8}
        _stream(gw, "/v1/chat/completions", body, {"x-request-id": "otel-off"})
        trace_id, parent, header = _traceparent()
        _stream(
            gw, "/v1/chat/completions", body, {"x-request-id": "otel-off-tp", "traceparent": header}
        )
    seen = sim.traceparents()
    assert "otel-off" not in seen
    assert seen["otel-off-tp"] == header  # the client's own, passed on as it came


def test_a_refusing_hanging_dripping_or_dead_collector_fails_no_request(
    certs: Any, sim: SimServer
) -> None:
    """Requests are served while the collector answers 503, while it holds the span export
    without an answer and drips the metrics export's, and once its port is closed."""
    policy = coder_policy({"coder-a": sim.url}, served=SERVED)

    def served(tag: str) -> None:
        for i in range(2):
            body = {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 8}
            _stream(gw, "/v1/chat/completions", body, {"x-request-id": f"otel-{tag}-{i}"})
        with gw.client() as c:
            r = c.post("/v1/chat/completions", json={"model": "coder", "messages": ASK})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]

    with OtlpReceiver() as otlp, mock.patch.dict(os.environ, FAST_EXPORT):
        args = ("--otlp-endpoint", otlp.url, "--otlp-metrics-interval", "0.3")
        with GatewayServer(policy, certs=certs, args=args) as gw:
            otlp.behaviour = {"/v1/traces": "503", "/v1/metrics": "503"}
            served("refused")
            otlp.wait(lambda: otlp.arrived.get("503", 0) >= 2)
            otlp.behaviour = {"/v1/traces": "hang", "/v1/metrics": "drip"}
            served("before-stuck")
            otlp.wait(lambda: min(otlp.arrived.get("hang", 0), otlp.arrived.get("drip", 0)))
            served("stuck")  # both export threads are held by the collector now
            otlp.__exit__()  # gone: its port refuses
            served("dead")
    assert sim.traceparents()["otel-dead-0"].startswith("00-")  # still traced to the engine


def test_a_clients_model_names_never_name_a_span_nor_a_metric_series(
    traced: tuple[GatewayServer, OtlpReceiver],
) -> None:
    """Unknown models, 64 KiB each, all distinct: one span name and one metric series."""
    gw, otlp = traced
    count = 3
    with gw.client() as c:
        for i in range(count):
            r = c.post(
                "/v1/chat/completions",
                json={"model": f"{i}-" + "m" * 65536, "messages": ASK},
                headers={"x-request-id": f"otel-long-{i}"},
            )
            assert r.status_code == 404

    def spans() -> list[Span] | None:
        named = otlp.spans_named(f"chat {genai.OTHER_MODEL}")
        got = [s for s in named if s.attributes["specrouter.request_id"].startswith("otel-long")]
        return got if len(got) == count else None

    for span in otlp.wait(spans):
        assert span.attributes["gen_ai.request.model"] == genai.OTHER_MODEL
        for value in span.attributes.values():
            assert not isinstance(value, str) or len(value) <= genai.MAX_ATTRIBUTE_CHARS

    def exported() -> bool:
        metric = otlp.latest("gen_ai.server.request.duration")
        other = [
            p
            for p in (metric.points if metric else [])
            if p.attributes["gen_ai.request.model"] == genai.OTHER_MODEL
        ]
        return sum(p.count for p in other) >= count

    otlp.wait(exported)
    assert max(len(s.name) for s in otlp.spans) < 64
    for name in {m.name for m in otlp.metrics}:
        metric = otlp.latest(name)
        assert metric is not None
        models = {p.attributes["gen_ai.request.model"] for p in metric.points}
        assert models <= {"coder", SERVED, genai.OTHER_MODEL}, name
        for p in metric.points:
            assert all(len(str(v)) < 64 for v in p.attributes.values()), name


def test_a_rejected_request_has_its_span_without_an_engine(
    traced: tuple[GatewayServer, OtlpReceiver], sim: SimServer
) -> None:
    gw, otlp = traced
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={"model": "no-such-model", "messages": ASK},
            headers={"x-request-id": "otel-rejected"},
        )
    assert 400 <= r.status_code < 500
    span = otlp.wait(
        lambda: [
            s
            for s in otlp.spans_named(f"chat {genai.OTHER_MODEL}")
            if s.attributes["specrouter.request_id"] == "otel-rejected"
        ]
    )[0]
    a = span.attributes
    assert a["gen_ai.request.model"] == genai.OTHER_MODEL, "not a name the policy routes"
    assert a["specrouter.outcome"] == "rejected" and a["error.type"] == "rejected"
    assert a["http.response.status_code"] == r.status_code
    assert span.status_code == 0, "a policy's 4xx is the client's error, not the gateway's"
    assert "gen_ai.provider.name" not in a and "specrouter.ttft_s" not in a
    assert "otel-rejected" not in sim.traceparents()


def test_an_unsampled_client_trace_stays_unsampled(
    traced: tuple[GatewayServer, OtlpReceiver], sim: SimServer
) -> None:
    gw, otlp = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 8}
    before = otlp.latest("gen_ai.server.request.duration")
    count = sum(p.count for p in before.points) if before is not None else 0
    headers = {"x-request-id": "otel-unsampled", "traceparent": f"00-{trace_id}-{parent}-00"}
    _stream(gw, "/v1/chat/completions", body, headers)

    def counted() -> bool:
        metric = otlp.latest("gen_ai.server.request.duration")
        return metric is not None and sum(p.count for p in metric.points) > count

    otlp.wait(counted)  # the metrics still count it
    sent = sim.traceparents()["otel-unsampled"]
    assert sent.startswith(f"00-{trace_id}-") and sent.endswith("-00") and parent not in sent
    ids = {s.attributes.get("specrouter.request_id") for s in otlp.spans_named("chat coder")}
    assert "otel-unsampled" not in ids
