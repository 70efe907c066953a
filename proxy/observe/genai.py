"""The OpenTelemetry GenAI names, once: metric names and units, histogram buckets, and the
attributes of a finished request's span and metrics (proxy/observe/otel.py exports them).

Pure: no SDK, no I/O. The names follow the GenAI semantic conventions (development stability)
where they define one; what they do not cover (the policy's choice, speculative decoding) is under
`specrouter.`. docs/opentelemetry.md lists every attribute.

No value a client chose, whatever its size, becomes a span name or a metric attribute: the
model is one the policy names, or OTHER_MODEL for every model it does not (else a client naming
a new model per request adds a metric series per request, kept for good, and a megabyte name
travels in every export); every other metric attribute is the policy's or the gateway's own.
Span attributes are cut at MAX_ATTRIBUTE_CHARS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.record.request import RequestRecord

Attributes = dict[str, str | bool | int | float | list[str]]

# Toward the agents the gateway is the server ...
SERVER_REQUEST_DURATION = "gen_ai.server.request.duration"
SERVER_TTFT = "gen_ai.server.time_to_first_token"
SERVER_TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
# ... toward the engines (vLLM) the client.
CLIENT_DURATION = "gen_ai.client.inference.duration"
CLIENT_TTFC = "gen_ai.client.inference.time_to_first_chunk"
CLIENT_TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
CLIENT_TOKEN_USAGE = "gen_ai.client.token.usage"

# The conventions' advice, extended: a long prefill's first token comes after minutes
# (first_byte_timeout_s is 300 s), and a request's duration includes its whole decode.
TTFT_BUCKETS = (
    *(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75),
    *(1.0, 2.5, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0),
)
DURATION_BUCKETS = (
    *(0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24),
    *(20.48, 40.96, 81.92, 163.84, 327.68, 655.36, 1310.72),
)
PER_TOKEN_BUCKETS = (
    *(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3),
    *(0.4, 0.5, 0.75, 1.0, 2.5),
)
TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)


@dataclass(frozen=True, slots=True)
class Instrument:
    name: str
    unit: str
    description: str
    buckets: tuple[float, ...]


INSTRUMENTS = (
    Instrument(SERVER_REQUEST_DURATION, "s", "client request to last byte", DURATION_BUCKETS),
    Instrument(SERVER_TTFT, "s", "client request to first token relayed", TTFT_BUCKETS),
    Instrument(
        SERVER_TIME_PER_OUTPUT_TOKEN,
        "s",
        "decode time per token after the first",
        PER_TOKEN_BUCKETS,
    ),
    Instrument(CLIENT_DURATION, "s", "engine asked to last byte", DURATION_BUCKETS),
    Instrument(CLIENT_TTFC, "s", "engine asked to its first chunk", TTFT_BUCKETS),
    Instrument(
        CLIENT_TIME_PER_OUTPUT_CHUNK, "s", "a request's mean time between chunks", PER_TOKEN_BUCKETS
    ),
    Instrument(CLIENT_TOKEN_USAGE, "{token}", "tokens per request, by type", TOKEN_BUCKETS),
)

OPERATIONS: dict[str, str] = {  # by Endpoint
    "chat": "chat",
    "responses": "chat",
    "messages": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
# gen_ai.token.type: the conventions' input and output, and the prompt's tokens read from the
# engine's prefix cache (a part of `input`, as gen_ai.usage.cache_read.input_tokens is).
TOKEN_TYPES = ("input", "output", "cache_read")

PREFIX = "specrouter."
# Every model the policy does not name, in span names and attributes (the conventions' word for
# a value outside the known set, as http.request.method's).
OTHER_MODEL = "_OTHER"
# A span attribute's string value at most (the SDK's span limit too: proxy/observe/otel.py).
MAX_ATTRIBUTE_CHARS = 256


def operation(record: RequestRecord) -> str:
    return OPERATIONS.get(record.endpoint, record.endpoint)


def request_model(record: RequestRecord) -> str:
    """The model as the client named it when the policy routes that name (the decision set
    `record.route`), else OTHER_MODEL."""
    return record.model if record.route else OTHER_MODEL


def span_name(record: RequestRecord) -> str:
    """`{operation} {model}`, as the conventions name an inference span (once decided)."""
    return f"{operation(record)} {request_model(record)}"


def is_error(record: RequestRecord) -> bool:
    """The request failed on the gateway's or an engine's side (a policy's 4xx did not)."""
    if record.outcome in ("ok", "client_gone"):
        return False
    return record.outcome != "rejected" or record.status >= 500


def metric_attributes(record: RequestRecord, provider: str | None) -> Attributes:
    """Bounded by the policy: no session, client or request id, no model it does not name."""
    out: Attributes = {
        "gen_ai.operation.name": operation(record),
        "gen_ai.request.model": request_model(record),
        PREFIX + "route": record.route,
        PREFIX + "variant": record.backend,
    }
    if provider is not None:
        out["gen_ai.provider.name"] = provider
    if record.outcome != "ok":
        out["error.type"] = record.outcome
    return out


def span_attributes(record: RequestRecord, provider: str | None, served: str | None) -> Attributes:
    """The request's figures, each under the name its request-log column has (`specrouter.`)
    or the conventions' name; unknown figures are left out, never zero."""
    m = record.m
    out = metric_attributes(record, provider)
    out["gen_ai.request.stream"] = record.stream
    out["http.response.status_code"] = record.status
    out["gen_ai.usage.output_tokens"] = m.completion_tokens
    optional: dict[str, str | int | float | None] = {
        "gen_ai.response.model": served,
        "gen_ai.request.temperature": record.temperature,
        "gen_ai.usage.input_tokens": m.prompt_tokens,
        "gen_ai.usage.cache_read.input_tokens": m.cached_tokens,
        "gen_ai.conversation.id": record.session or None,
        PREFIX + "request_id": record.request_id,
        PREFIX + "client": record.client,
        PREFIX + "endpoint": record.endpoint,
        PREFIX + "reason": record.reason,
        PREFIX + "outcome": record.outcome,
        PREFIX + "policy_version": record.policy_version,
        PREFIX + "agent": record.agent or None,
        PREFIX + "content_class": record.content_class,
        PREFIX + "continued_from": record.continued_from or None,
        PREFIX + "ttft_s": m.ttft,
        PREFIX + "e2e_s": m.e2e,
        PREFIX + "tokens_per_step": m.acceptance,
        PREFIX + "tps_source": m.tps_source,
        PREFIX + "finish_reason": m.finish_reason,
    }
    out.update({k: v for k, v in optional.items() if v is not None and v != ""})
    if m.finish_reason is not None:
        out["gen_ai.response.finish_reasons"] = [m.finish_reason]
    out[PREFIX + "canary"] = record.canary
    out[PREFIX + "retries"] = record.retries
    out[PREFIX + "concurrency"] = record.concurrency
    for phase, seconds in m.phases().items():
        out[f"{PREFIX}phase.{phase}_s"] = seconds
    return bounded(out)


def bounded(attributes: Attributes) -> Attributes:
    """`attributes` with every string (in a list too) cut at MAX_ATTRIBUTE_CHARS."""
    n = MAX_ATTRIBUTE_CHARS
    for key, value in attributes.items():
        if isinstance(value, str):
            attributes[key] = value[:n]
        elif isinstance(value, list):
            attributes[key] = [v[:n] for v in value]
    return attributes


def server_time_per_output_token(record: RequestRecord) -> float | None:
    """Decode time over the tokens after the first (successful streams)."""
    m = record.m
    if record.outcome != "ok" or m.t_first_token is None or m.t_last_token is None:
        return None
    if m.completion_tokens < 2 or not m.stream:
        return None
    return (m.t_last_token - m.t_first_token) / (m.completion_tokens - 1)


def client_time_per_output_chunk(record: RequestRecord) -> float | None:
    """The request's mean time between the engine's token chunks after the first: one
    observation per request (the per-chunk gaps stay off the export path)."""
    m = record.m
    if m.t_first_token is None or m.t_last_token is None:
        return None
    chunks = len(m.step_gaps) if m.step_gaps else m.delta_events - 1
    return (m.t_last_token - m.t_first_token) / chunks if chunks > 0 else None
