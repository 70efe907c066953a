"""The trace headers an engine gets with the gateway's own span (OpenTelemetry on): its
`traceparent`, and the client's `tracestate` only when it belongs to the client's valid trace.
(With OpenTelemetry off, tests/security/test_session_attacks.py replays them end to end.)"""

from __future__ import annotations

import pytest

from proxy.relay.tracecontext import trace_headers

OWN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
CLIENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("sent", "got"),
    [
        ({b"traceparent": CLIENT.encode(), b"tracestate": b"a=1"}, {"tracestate": "a=1"}),
        ({b"traceparent": b"junk", b"tracestate": b"a=1"}, {}),  # not the client's trace
        ({b"tracestate": b"a=1"}, {}),
        ({b"traceparent": CLIENT.encode(), b"tracestate": b"a=" + b"x" * 600}, {}),
        ({}, {}),
    ],
)
def test_the_gateway_s_span_parents_the_engine(
    sent: dict[bytes, bytes], got: dict[str, str]
) -> None:
    assert trace_headers(sent, OWN) == {"traceparent": OWN, **got}
