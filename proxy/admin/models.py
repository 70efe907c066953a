"""The admin API's request and response bodies, as pydantic models (its OpenAPI description)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel

from policies.schema import PolicyDocument
from policies.types import Endpoint
from proxy.observe.events import MAX_EVENTS, EventKind


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")

    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorOut(BaseModel):
    """OpenAI's error shape, as on the public listener. 412 adds `current_version`, 422 `errors`."""

    error: ErrorDetail


class PolicyOut(BaseModel):
    """`GET /admin/policy`: PUT accepts this body back unchanged (or the bare document)."""

    version: str = Field(description="The running version: its ETag, unquoted.")
    document: PolicyDocument


class PolicyIn(RootModel[PolicyOut | PolicyDocument]):
    """`PUT /admin/policy` and `validate`: GET's body, or the bare document (also as YAML)."""


class AppliedOut(BaseModel):
    version: str
    number: int = Field(description="The version's number in the history.")
    changes: list[str] = Field(description="What changed, field by field (empty: nothing).")


class ValidOut(BaseModel):
    valid: bool
    version: str = Field(description="The version the document would have once applied.")


class ExplainIn(BaseModel):
    request: dict[str, Any] = Field(description="A request body, as a client would send it.")
    endpoint: Endpoint = "chat"
    client: str | None = Field(None, description="A client of the policy (default: the first).")
    state: dict[str, Any] | None = Field(
        None,
        description='Engine state, e.g. {"backends": {"a": {"health": "down"}}}; '
        "the live state when absent.",
    )
    pin: str | None = Field(None, description="A pinned variant (`X-Specrouter-Variant`).")
    now: float | None = Field(None, description="Monotonic time of the request.")
    headers: dict[str, str] | None = Field(
        None,
        description="The request's headers: its session is identified from them (agent "
        "headers, then `user`, then the fingerprint) and looked up in the live session table.",
    )
    residency: dict[str, Any] | None = Field(
        None,
        description="The decided engine's residency given by hand: {kv_tokens, "
        "shared_prefix_tokens, residents: [{key, prefix_tokens, idle_s}], waiting: [{key, "
        "waited_s}]} (as `specrouter policy explain --residency`); the live one when absent.",
    )
    session: str | dict[str, Any] | None = Field(
        None,
        description="A session key of the live table (`s-...`, as the request log and the "
        "dashboard show it), or a row given by hand: {engine, prefix_tokens, turns, "
        "out_tokens_per_turn, mean_turns, subagent, attained_tokens} (as `specrouter policy "
        "explain --session`).",
    )


class SessionOut(BaseModel):
    """The session the explanation used, and the stickiness verdict with its arithmetic."""

    key: str
    source: str = Field(description="`table` (the live row), `given`, or `new` (no live row).")
    engine: str | None
    prefix_tokens: int
    turns: int
    out_tokens_per_turn: float
    mean_turns: float | None
    subagent: bool
    attained_tokens: int = Field(
        0, description="Tokens served for it within the fairness window (its priority level)."
    )
    verdict: str | None = Field(
        None, description="new, stay, move or the constraint that moved it; null: not sticky."
    )
    detail: str = Field(
        "",
        description="e.g. the decode gain over the remaining turns vs the "
        "re-prefill cost of the prefix",
    )
    lost_tokens: int = Field(
        0,
        description="The live row's prefix tokens its turns found uncached of what the engine "
        "held (docs/sessions.md, Lost prefixes); 0 for a row given or new.",
    )
    loss_cause: str = Field("", description="The last loss's cause: client-rewrite, ...")
    loss_where: str = Field("", description="The last client rewrite's field or item.")
    resident_tokens: int | None = Field(
        None,
        description="The live row's prefix its engine holds now, from the engine's KV events "
        "(the unbroken run of its blocks from the first); null without events for it.",
    )


class AdmissionOut(BaseModel):
    """Session-aware admission's verdict for the turn on the decided engine
    (policies/admission.py), against the engine's live residency or the one given."""

    backend: str
    admit: bool
    reason: str = Field(
        description="off, class, kv-unknown, resident, fits, alone; full, queue, yield"
    )
    detail: str = Field(description="the arithmetic: resident prefixes + turns vs the KV budget")
    ahead: int = Field(description="sessions waiting before this one")
    expected_wait_s: float
    source: str = Field(description="`live` (the gateway's residency) or `given`")


class ExplainOut(BaseModel):
    policy_version: str
    decision: dict[str, Any] = Field(description="The decision and every rule's verdict.")
    session: SessionOut | None = Field(None, description="Null when nothing names a session.")
    admission: AdmissionOut | None = Field(
        None, description="Null when session-aware admission is off and no residency is given."
    )


class HistoryEntry(BaseModel):
    model_config = ConfigDict(extra="allow")

    number: int
    version: str
    time: float
    who: str
    changes: list[str]
    note: str = ""


class HistoryOut(BaseModel):
    current: str
    history: list[HistoryEntry]


class RollbackIn(BaseModel):
    # Strict: `true`, `1.9` or a 300-digit number is no version (pydantic would coerce).
    version: int = Field(strict=True, ge=1, le=2**31, description="A number from the history.")


class BackendStatus(BaseModel):
    health: str
    in_flight: int
    running: int | None
    waiting: int | None
    kv_usage: float | None
    acceptance: float | None


class ReadyOut(BaseModel):
    """`GET /admin/readyz`: 200 when ready, else 503, with the same body."""

    ready: bool
    draining: bool
    routes: dict[str, bool] = Field(description="Per route: whether a variant of it is up.")


class EventOut(BaseModel):
    """One of the gateway's recent events (proxy/observe/events.py)."""

    time: float = Field(description="Wall clock, seconds since the epoch.")
    kind: EventKind
    backend: str | None = Field(None, description="The backend, for health and repair events.")
    version: str | None = Field(
        None, description="The policy version applied, or kept when a file was refused."
    )
    detail: str = ""


class StatusOut(BaseModel):
    policy_version: str
    backends: dict[str, BackendStatus]
    in_flight: int
    events: list[EventOut] = Field(
        description=f"The last {MAX_EVENTS} events at most: backend down / up / starting, "
        "repairs, applied and refused policies; oldest first."
    )
