"""Process settings: where to listen, TLS material, the admin tokens, the operator file, the
state directory.

The single source of truth for settings. Values come from flags, then `SPECROUTER_*` environment
variables, then these defaults. What to route where lives in the policy file, not here.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from policies.loading import DEFAULT_LIMITS, DocumentLimits
from proxy.auth import named_token
from proxy.body_budget import BODY_BUDGET_BYTES, BODY_BUDGET_PER_CLIENT_BYTES


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTER_", extra="ignore")

    config: Path = Field(Path("policies/demo.yaml"), description="policy/config YAML file")
    listen: str = Field("0.0.0.0:8443", description="public listener host:port")
    admin_listen: str = Field("127.0.0.1:9443", description="admin listener host:port")
    tls_cert: Path | None = Field(None, description="server certificate chain (PEM)")
    tls_key: Path | None = Field(None, description="server private key (PEM)")
    insecure_http: bool = Field(False, description="serve plain HTTP (loopback only)")
    # Each `NAME=TOKEN` (a bare TOKEN is named "admin"): the audit log records the NAME.
    admin_token: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="bearer tokens for the admin listener"
    )
    admin_tls: bool = Field(False, description="serve the admin listener over TLS too")
    admin_client_ca: Path | None = Field(
        None, description="require admin client certificates signed by this CA (implies TLS)"
    )
    dashboard_token: str | None = Field(None, description="read-only token for the dashboard")
    scrape_token: str | None = Field(
        None, description="when set, /metrics on the admin listener needs it (or an admin token)"
    )
    dashboard_session_s: float = Field(12 * 3600.0, description="dashboard login lifetime")
    auth_failures_per_minute: int = Field(
        10, description="failed authentications a source may make per minute (0: no limit)"
    )
    operator_file: Path | None = Field(
        None, description="operator-defined repair actions, engine secrets and engine hosts"
    )
    metrics_listen: str | None = Field(
        None, description="host:port of a plain-HTTP /metrics listener (loopback only)"
    )
    state_dir: Path = Field(Path(".state"), description="certificates, policy versions, logs")
    access_log: bool = Field(False, description="one line per request on stderr (no content)")
    # OpenTelemetry GenAI spans and metrics (proxy/observe/otel.py): off unless set. The SDK's
    # own OTEL_* variables (headers, timeouts, sampler, resource) apply to what is exported.
    otlp_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector base URL (http://host:4318): GenAI spans, metrics"
    )
    otlp_metrics_interval_s: float = Field(
        10.0, gt=0, le=3600, description="the GenAI metrics are exported this often"
    )

    redis_url: str | None = Field(
        None,
        description="client limits and the session table shared by replicas (a session's row "
        "reaches the others within session_flush_s + session_pull_s)",
    )
    redis_prefix: str = Field(
        "specrouter", min_length=1, max_length=64, description="the gateway's keys in Redis"
    )
    # The session table's staleness across replicas is at most flush + pull (+ one round trip):
    # a local change waits for the next flush, another replica reads it at its next pull.
    session_flush_s: float = Field(0.5, gt=0, le=60, description="session changes sent this often")
    session_pull_s: float = Field(
        1.0, gt=0, le=60, description="other replicas' session changes read this often"
    )
    # x-codex-turn-state tokens (proxy/relay/turnstate.py) are signed with this; unset: one
    # random secret shared through Redis with --redis-url, else a random one per process.
    # Its length and spread are checked at start (proxy/safety.py), as the tokens' are.
    turn_state_secret: str | None = Field(
        None, description="signs x-codex-turn-state tokens (same on every replica)"
    )
    session_queue_max: int = Field(
        10_000, ge=1, description="session changes held while Redis is away (oldest dropped)"
    )

    max_body_bytes: int = Field(8 * 1024 * 1024, description="request bodies above this get 413")
    header_timeout_s: float = 10.0  # a slow-header client is cut after this (408)
    body_timeout_s: float = 30.0  # a slow-body client is cut after this (408)
    connect_timeout_s: float = 5.0
    # Prefill of a 100K-token prompt at ~2,000 tokens/s is legitimate: be generous.
    first_byte_timeout_s: float = 300.0  # to the engine's first output (the prefill)
    idle_timeout_s: float = 60.0  # between two chunks, after the first output
    # A stream whose client reads nothing (its socket full, the relay paused) for this long is
    # ended: the client's connection is closed and the engine's work aborted, so a client that
    # never reads cannot hold an engine's admission slot (proxy/relay/push.py).
    client_write_timeout_s: float = Field(30.0, gt=0, description="a paused stream's limit")
    scrape_interval_s: float = 2.0  # backend /metrics and /health
    # How streams are relayed: "push" (engine reads written to the client from the read
    # callback, proxy/relay/push.py) or "pull" (an async pull loop, proxy/relay/pull.py).
    relay: Literal["push", "pull"] = "push"
    drain_timeout_s: float = 20.0  # SIGTERM: how long streams in flight may still run

    # Connections (proxy/servers.py). Clients that never start TLS, or idle after a request
    # without credentials, would otherwise hold descriptors for a minute each.
    tls_handshake_timeout_s: float = 10.0
    max_connections: int = Field(4096, ge=1, description="per listener; logged when reached")
    # One source address cannot fill max_connections: past this many open connections from it,
    # a new one is closed at the accept, before TLS (proxy/servers.py, SourceCap).
    max_connections_per_source: int = Field(
        512, ge=1, description="open connections one client address may hold, per listener"
    )
    # ... nor can one network (IPv4 /24, IPv6 /64: one host may have all of a /64).
    max_connections_per_network: int = Field(
        1024, ge=1, description="open connections one /24 or /64 may hold, per listener"
    )
    # Request bodies' memory across the process and per client (proxy/body_budget.py: the
    # defaults come from the gateway's memory, the Kubernetes limit and the deploy plan's).
    body_budget_bytes: int = Field(
        BODY_BUDGET_BYTES, ge=1, description="request bodies in flight, in all"
    )
    body_budget_per_client_bytes: int = Field(
        BODY_BUDGET_PER_CLIENT_BYTES, ge=1, description="request bodies in flight, per client"
    )
    body_budget_wait_s: float = Field(
        1.0, ge=0, description="a request over the budget waits this long, then gets 503"
    )
    keep_alive_s: float = 75.0  # idle keep-alive after an authenticated request
    keep_alive_unauthenticated_s: float = 5.0  # ... after requests without valid credentials
    # Client input (proxy/relay/fields.py): counts that multiply the work asked for are refused
    # above these (400 naming the field), never clamped.
    max_n: int = Field(8, ge=1, description="`n` and `best_of` above this get 400")
    max_top_logprobs: int = Field(20, ge=0, description="chat `top_logprobs` above this get 400")
    max_logprobs: int = Field(5, ge=0, description="completions `logprobs` above this get 400")
    max_messages: int = Field(4096, ge=1, description="chat messages / responses input items")
    max_json_depth: int = Field(128, ge=2, le=250, description="request JSON nesting depth")
    max_json_containers: int = Field(
        262_144,
        ge=1024,
        description="JSON objects and arrays in one request body (413 above: each is 60-200 "
        "bytes once parsed, a list of empty objects ~21 times its JSON)",
    )
    # Limits on what policy documents and engines may send (docs/limits.md, engine side).
    max_policy_bytes: int = Field(DEFAULT_LIMITS.max_bytes, description="policy document size")
    max_policy_rules: int = Field(DEFAULT_LIMITS.max_rules, description="rules over all routes")
    max_dashboard_bytes: int = Field(256 * 1024, description="one dashboard snapshot")
    # A Responses stream's final event carries the whole output: far above the largest answer.
    max_sse_frame_bytes: int = Field(16 * 1024 * 1024, description="one engine SSE event")
    max_metrics_bytes: int = Field(8 * 1024 * 1024, description="one engine /metrics page")
    max_engine_header_bytes: int = Field(64 * 1024, description="an engine's response head")

    @field_validator("admin_token", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        # The environment (SPECROUTER_ADMIN_TOKEN) gives one token, the flag a list.
        if value is None:
            return []
        return [value] if isinstance(value, str) else value

    @field_validator("admin_token")
    @classmethod
    def _names_unique(cls, value: list[str]) -> list[str]:
        names = [named_token(v, "admin")[0] for v in value]
        if len(set(names)) != len(names):
            raise ValueError(f"two admin tokens share a name: {sorted(names)}")
        return value

    def document_limits(self) -> DocumentLimits:
        return DocumentLimits(self.max_policy_bytes, self.max_policy_rules)

    def admin_tokens(self) -> dict[str, str]:
        """Name -> token, for every `--admin-token`."""
        return dict(named_token(v, "admin") for v in self.admin_token)


def split_hostport(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


def is_loopback(host: str) -> bool:
    """An address on this machine's loopback: `localhost`, or an IP literal in 127.0.0.0/8 or
    ::1. A name that merely begins like one (`127.0.0.1.nip.io` resolves anywhere) is not."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
