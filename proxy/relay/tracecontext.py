"""The W3C Trace Context headers an engine gets (https://www.w3.org/TR/trace-context/), bounded.

`traceparent` is the gateway's own span's when OpenTelemetry is on (proxy/observe/otel.py),
else the client's when it has the standard's 55-character form; any other value goes nowhere.
The client's `tracestate` goes only with a valid client `traceparent` (it belongs to that
trace, which the gateway's span continues), and only within the standard's bounds: at most 32 list members and `TRACESTATE_MAX_BYTES` (the size every vendor
should propagate); a larger one is dropped whole, which the standard allows. A client's 60 KB
`tracestate` once reached every engine it was routed to.
"""

from __future__ import annotations

import re
from typing import Final

TRACESTATE_MAX_BYTES: Final = 512
TRACESTATE_MAX_MEMBERS: Final = 32
# version (not ff) - trace id (not all zero) - parent id (not all zero) - flags
_TRACEPARENT: Final = re.compile(
    rb"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)


def trace_headers(headers: dict[bytes, bytes], traceparent: str) -> dict[str, str]:
    """The trace headers for the engine: `traceparent` (the gateway's span's, else the client's
    when valid) and the client's `tracestate` with a valid client one, within bounds."""
    client = headers.get(b"traceparent")
    valid = client is not None and _TRACEPARENT.fullmatch(client) is not None
    if not traceparent:
        if client is None or not valid:
            return {}
        traceparent = client.decode("ascii")
    out = {"traceparent": traceparent}
    state = headers.get(b"tracestate")
    if (
        valid
        and state is not None
        and len(state) <= TRACESTATE_MAX_BYTES
        and state.count(b",") < TRACESTATE_MAX_MEMBERS
    ):
        out["tracestate"] = state.decode("latin-1")
    return out
