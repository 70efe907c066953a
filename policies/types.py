"""The policy engine's inputs and output: small frozen values, no framework types.

The gateway builds a `RequestView` and a `LiveState` at the edge (`proxy/`), calls
`policies.engine.decide(view, state, policy)`, and acts on the `Decision`. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Endpoint = Literal["chat", "completions", "embeddings", "responses", "messages"]
Health = Literal["up", "down", "starting"]

# A policy names a sampling field once (its defaults and clamps say `max_tokens`); each API
# spells it its own way. Per API kind: policy name -> the body fields that carry it, the first
# present one winning (vLLM's chat reads `max_completion_tokens` before `max_tokens`).
FIELD_NAMES: Mapping[Endpoint, Mapping[str, tuple[str, ...]]] = {
    "chat": {"max_tokens": ("max_completion_tokens", "max_tokens")},
    "responses": {"max_tokens": ("max_output_tokens",)},
}
# Bounds an API puts on a field whatever the policy says (Anthropic's temperature is 0-1).
FIELD_BOUNDS: Mapping[Endpoint, Mapping[str, tuple[float, float]]] = {
    "messages": {"temperature": (0.0, 1.0)}
}


@dataclass(frozen=True, slots=True)
class ContentSignals:
    """Cheap signals read from the request body, for the content classifier."""

    tools_declared: bool = False
    code_in_recent_messages: bool = False  # code fences or file paths in the last few messages
    system_prompt_mentions_code: bool = False


@dataclass(frozen=True, slots=True)
class SessionView:
    """The request's session (policies/sessions.py) and what the session table knows of it."""

    key: str
    subagent: bool = False
    engine: str | None = None  # the engine holding its prefix; None: a new session
    prefix_tokens: int = 0  # tokens of its conversation that engine holds (prompt + output)
    turns: int = 0  # requests it has made
    out_tokens_per_turn: float = 0.0
    mean_turns: float | None = None  # turns per session over the table; None: too few seen
    # Tokens served for it within the policy's fairness window (policies/fairness.py).
    attained_tokens: int = 0


@dataclass(frozen=True, slots=True)
class RequestView:
    endpoint: Endpoint
    model: str
    client: str
    stream: bool = False
    fields_set: frozenset[str] = frozenset()  # top-level body keys the client sent
    temperature: float | None = None  # the client's value, None when unset
    min_p: float | None = None
    has_logit_bias: bool = False
    n: int = 1
    signals: ContentSignals = ContentSignals()
    pinned_variant: str | None = None  # X-Specrouter-Variant header, if any
    canary_bucket: float = 0.0  # in [0, 1): a stable hash of the client, computed outside
    now: float = 0.0  # monotonic seconds, from the caller's clock
    # Numeric top-level fields the client sent (max_tokens, top_p, ...), for the route's clamps.
    numeric_fields: Mapping[str, float] = field(default_factory=dict)
    session: SessionView | None = None
    # The agent declared a compaction or auxiliary request (policies/agent_signals.py): it is
    # served where its session is and never moves it. It grants nothing else.
    keeps_place: bool = False
    # The engine a verified turn-state token names (proxy/relay/turnstate.py): every request of
    # the turn stays there while it can serve. None: no token, or one that did not verify.
    turn_engine: str | None = None
    # The agent's request class (policies/agent_signals.py's REQUEST_CLASSES, "" undeclared):
    # its fairness level on priority-scheduling engines (policies/fairness.py).
    request_class: str = ""


@dataclass(frozen=True, slots=True)
class GuardState:
    """Acceptance-guard state for one variant, advanced outside the engine (see policies.guard)."""

    tripped: bool = False
    low_since: float | None = None  # when acceptance first fell below the threshold
    high_since: float | None = None  # when it first rose back above the recovery threshold
    tripped_at: float | None = None  # when traffic was diverted (for the probe after a while)
    probing: bool = False  # traffic is back on trial: one low reading diverts it again


@dataclass(frozen=True, slots=True)
class BackendState:
    health: Health = "up"
    in_flight: int = 0  # the gateway's own count of open requests to this backend
    running: int | None = None  # vllm:num_requests_running, when scraped
    waiting: int | None = None  # vllm:num_requests_waiting, when scraped
    kv_usage: float | None = None  # vllm:kv_cache_usage_perc
    acceptance: float | None = None  # accepted tokens per target step over the window


@dataclass(frozen=True, slots=True)
class LiveState:
    backends: Mapping[str, BackendState] = field(default_factory=dict)
    guards: Mapping[str, GuardState] = field(default_factory=dict)  # keyed by backend name


@dataclass(frozen=True, slots=True)
class RuleVerdict:
    rule: str
    verdict: str  # "matched", "skipped", "not-applicable", ... with a short why
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Rejection:
    """Answer the client without a round trip, in vLLM's error shape."""

    status: int
    type: str
    message: str
    param: str | None = None
    retry_after_s: float | None = None  # for 503: the Retry-After header


@dataclass(frozen=True, slots=True)
class Decision:
    route: str
    backend: str | None  # None only with a rejection
    reason: str  # the name of the rule that decided
    inject: Mapping[str, Any] = field(default_factory=dict)  # top-level body fields to set
    defaults_applied: tuple[str, ...] = ()  # names of injected defaults, for the header/metrics
    fallbacks: tuple[str, ...] = ()  # backends to try, in order, if `backend` fails before a byte
    content_class: str | None = None
    canary: bool = False
    priority: int | None = None
    rejection: Rejection | None = None
    verdicts: tuple[RuleVerdict, ...] = ()  # every rule's verdict, only with decide(explain=True)
    clamped: tuple[str, ...] = ()  # client fields brought within the route's clamps (in `inject`)
