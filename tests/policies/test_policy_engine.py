"""The policy engine, one table row per case: (rules, request, live state) -> decision.

Variants of the test route, in order: A (deep speculative, the default), B (shallow speculative,
the route's fallback, runs priority scheduling), P (no speculation).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from policies.compiled import CompiledPolicy
from policies.engine import UNSUPPORTED_WITH_SPECULATION, canary_bucket, decide
from policies.schema import validate_policy
from policies.types import (
    BackendState,
    ContentSignals,
    Decision,
    GuardState,
    LiveState,
    RequestView,
)

KEY = "0" * 63  # + one hex digit per client

CODE = ContentSignals(tools_declared=True)
PROSE = ContentSignals()


def make_policy(rules: list[dict[str, Any]] | None = None, **route: Any) -> CompiledPolicy:
    spec = {"spec": {"method": "dflash", "num_speculative_tokens": 7}}
    doc = {
        "schema": 1,
        "backends": {
            "a": {
                "url": "http://127.0.0.1:1",
                "served_model_name": "m",
                "speculative": spec["spec"],
            },
            "b": {
                "url": "http://127.0.0.1:2",
                "served_model_name": "m",
                "priority_scheduling": True,
                "speculative": {"method": "mtp", "num_speculative_tokens": 3},
            },
            "p": {"url": "http://127.0.0.1:3", "served_model_name": "m"},
            "e": {"url": "http://127.0.0.1:4", "served_model_name": "emb", "task": "embed"},
        },
        "routes": {
            "coder": {
                "models": ["coder", "qwen"],
                "variants": ["a", "b", "p"],
                "fallback": "b",
                "defaults": {"temperature": 0.7},
                "rules": rules or [],
                **route,
            },
            "embed": {"models": ["emb"], "task": "embed", "variants": ["e"]},
        },
        "clients": [
            {"name": "agent", "key_sha256": KEY + "1", "priority": 3},
            {
                "name": "pinner",
                "key_sha256": KEY + "2",
                "may_pin": True,
                "allowed_variants": ["a", "b"],
            },
            {"name": "vip", "key_sha256": KEY + "3"},
            {"name": "plain-only", "key_sha256": KEY + "4", "allowed_variants": ["p"]},
            {"name": "embed-only", "key_sha256": KEY + "5", "allowed_variants": ["e"]},
            {"name": "tuned", "key_sha256": KEY + "6", "defaults": {"top_p": 0.8}},
        ],
    }
    return CompiledPolicy(validate_policy(doc))


def view(**kw: Any) -> RequestView:
    base: dict[str, Any] = {
        "endpoint": "chat",
        "model": "coder",
        "client": "agent",
        "signals": CODE,
        "fields_set": frozenset({"model", "messages"}),
    }
    base.update(kw)
    for name in ("temperature", "min_p"):  # a field the view carries was sent by the client
        if kw.get(name) is not None:
            base["fields_set"] = base["fields_set"] | {name}
    return RequestView(**base)


def live(guards: dict[str, GuardState] | None = None, **backends: BackendState) -> LiveState:
    return LiveState(backends=backends, guards=guards or {})


DOWN = BackendState(health="down")
STARTING = BackendState(health="starting")
TRIPPED = GuardState(tripped=True, tripped_at=0.0)

LOAD = {"name": "deep", "kind": "load", "use": "a", "max_in_flight": 2, "otherwise": "b"}
LOAD_OPEN = {"name": "deep-open", "kind": "load", "use": "a", "max_in_flight": 2}
CONTENT = {"name": "prose-to-p", "kind": "content", "classes": ["prose"], "use": "p"}
HOT = {"name": "hot", "kind": "sampling", "temperature_at_least": 1.0, "use": "p"}
COOL = {"name": "cool", "kind": "sampling", "temperature_below": 0.7, "use": "p"}
CANARY = {"name": "canary-b", "kind": "canary", "use": "b", "percent": 10}
VIP = {"name": "vip-plain", "kind": "client", "clients": ["vip"], "use": "p"}
GUARD = {"name": "a-acceptance", "kind": "acceptance_guard", "variant": "a", "below": 2.8}
GUARD_TO_P = {**GUARD, "fallback": "p"}
HEALTH_DOWN_ONLY = {"name": "hc", "kind": "health", "unavailable": ["down"]}


@dataclass
class Row:
    id: str
    rules: list[dict[str, Any]]
    request: dict[str, Any]
    state: LiveState
    backend: str | None
    reason: str
    fallbacks: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # other Decision fields to check
    route: dict[str, Any] = field(default_factory=dict)


ROWS = [
    # No rule: the route's first variant; the fallback first in the retry order.
    Row("default", [], {}, live(), "a", "default", ("b", "p")),
    # Load: "at most N" counts this request; the threshold exactly reached still uses A.
    Row("load-idle", [LOAD], {}, live(), "a", "deep", ("b", "p")),
    Row("load-exactly-n", [LOAD], {}, live(a=BackendState(in_flight=1)), "a", "deep"),
    Row("load-over-n", [LOAD], {}, live(a=BackendState(in_flight=2)), "b", "deep", ("a", "p")),
    Row(
        "load-other-variant-not-counted", [LOAD], {}, live(b=BackendState(in_flight=9)), "a", "deep"
    ),
    Row(
        "load-running-used",
        [{**LOAD, "count": "running"}],
        {},
        live(a=BackendState(in_flight=0, running=2)),
        "b",
        "deep",
    ),
    Row(
        "load-running-unscraped-uses-in-flight",
        [{**LOAD, "count": "running"}],
        {},
        live(a=BackendState(in_flight=2)),
        "b",
        "deep",
    ),
    Row("load-in-flight-ignores-running", [LOAD], {}, live(a=BackendState(running=9)), "a", "deep"),
    Row(
        "load-max-running-higher",
        [{**LOAD, "count": "max"}],
        {},
        live(a=BackendState(in_flight=0, running=3)),
        "b",
        "deep",
    ),
    Row(
        "load-max-in-flight-higher",
        [{**LOAD, "count": "max"}],
        {},
        live(a=BackendState(in_flight=1)),
        "a",
        "deep",
    ),
    Row(
        "load-route-scope",
        [{**LOAD, "scope": "route"}],
        {},
        live(a=BackendState(in_flight=1), b=BackendState(in_flight=1)),
        "b",
        "deep",
    ),
    Row(
        "load-variant-scope-same-state",
        [LOAD],
        {},
        live(a=BackendState(in_flight=1), b=BackendState(in_flight=1)),
        "a",
        "deep",
    ),
    Row(
        "load-open-over-falls-through",
        [LOAD_OPEN, HOT],
        {"temperature": 1.2},
        live(a=BackendState(in_flight=5)),
        "p",
        "hot",
    ),
    Row(
        "load-open-over-no-more-rules",
        [LOAD_OPEN],
        {},
        live(a=BackendState(in_flight=5)),
        "a",
        "default",
    ),
    # Content: the class is recorded whatever the rules.
    Row(
        "content-prose",
        [CONTENT],
        {"signals": PROSE},
        live(),
        "p",
        "prose-to-p",
        extra={"content_class": "prose"},
    ),
    Row(
        "content-code-no-match",
        [CONTENT],
        {},
        live(),
        "a",
        "default",
        extra={"content_class": "code"},
    ),
    # Sampling: the effective temperature, after defaults; [at_least, below).
    Row("sampling-default-injected", [HOT], {}, live(), "a", "default"),
    Row("sampling-client-exactly-at-least", [HOT], {"temperature": 1.0}, live(), "p", "hot"),
    Row("sampling-client-below", [HOT], {"temperature": 0.99}, live(), "a", "default"),
    Row("sampling-below-is-exclusive", [COOL], {}, live(), "a", "default"),
    Row("sampling-below-matches", [COOL], {"temperature": 0.2}, live(), "p", "cool"),
    Row("sampling-unset-uses-model-default", [HOT], {}, live(), "p", "hot", route={"defaults": {}}),
    Row(
        "sampling-null-temperature-not-defaulted",
        [HOT],
        {"fields_set": frozenset({"model", "temperature"})},
        live(),
        "p",
        "hot",
        extra={"inject": {}},
    ),
    Row(
        "sampling-model-default-configurable",
        [HOT],
        {},
        live(),
        "a",
        "default",
        route={"defaults": {}, "model_default_temperature": 0.6},
    ),
    # Canary: sticky by the client's bucket, [0, P %).
    Row(
        "canary-in",
        [CANARY],
        {"canary_bucket": 0.05},
        live(),
        "b",
        "canary-b",
        extra={"canary": True},
    ),
    Row(
        "canary-boundary-out",
        [CANARY],
        {"canary_bucket": 0.10},
        live(),
        "a",
        "default",
        extra={"canary": False},
    ),
    Row(
        "canary-zero-percent",
        [{**CANARY, "percent": 0}],
        {"canary_bucket": 0.0},
        live(),
        "a",
        "default",
    ),
    Row(
        "canary-hundred-percent",
        [{**CANARY, "percent": 100}],
        {"canary_bucket": 0.9999},
        live(),
        "b",
        "canary-b",
    ),
    Row(
        "canary-moved-by-health-not-labelled",
        [CANARY],
        {"canary_bucket": 0.0},
        live(b=DOWN),
        "a",
        "health",
        extra={"canary": False},
    ),
    # Client rule.
    Row("client-rule", [VIP], {"client": "vip"}, live(), "p", "vip-plain"),
    Row("client-rule-other-client", [VIP], {}, live(), "a", "default"),
    # Order of evaluation: the first selector that matches decides.
    Row("order-canary-first", [CANARY, LOAD], {"canary_bucket": 0.0}, live(), "b", "canary-b"),
    Row("order-load-first", [LOAD, CANARY], {"canary_bucket": 0.0}, live(), "a", "deep"),
    Row(
        "order-no-match-then-match", [CONTENT, HOT, LOAD], {"temperature": 1.5}, live(), "p", "hot"
    ),
    Row(
        "order-guard-position-irrelevant",
        [GUARD, LOAD],
        {},
        live({"a": TRIPPED}),
        "b",
        "a-acceptance",
    ),
    # Health: built in, or named and tuned by a rule.
    Row("health-builtin-down", [LOAD], {}, live(a=DOWN), "b", "health", ("p",)),
    Row("health-builtin-starting", [], {}, live(a=STARTING), "b", "health"),
    Row("health-rule-name", [HEALTH_DOWN_ONLY], {}, live(a=DOWN), "b", "hc"),
    Row("health-rule-starting-allowed", [HEALTH_DOWN_ONLY], {}, live(a=STARTING), "a", "default"),
    Row("health-fallback-down-too", [], {}, live(a=DOWN, b=DOWN), "p", "health", ()),
    Row("health-down-fallback-skipped-in-retries", [], {}, live(b=DOWN), "a", "default", ("p",)),
    Row(
        "health-all-down",
        [LOAD],
        {},
        live(a=DOWN, b=DOWN, p=DOWN),
        None,
        "no-backend",
        extra={"rejection.status": 503, "rejection.retry_after_s": 5.0},
    ),
    # Acceptance guard.
    Row("guard-tripped", [GUARD, LOAD], {}, live({"a": TRIPPED}), "b", "a-acceptance", ("p", "a")),
    Row(
        "guard-own-fallback",
        [GUARD_TO_P],
        {},
        live({"a": TRIPPED}),
        "p",
        "a-acceptance",
        ("b", "a"),
    ),
    Row("guard-not-tripped", [GUARD], {}, live({"a": GuardState(low_since=1.0)}), "a", "default"),
    Row("guard-probing-serves", [GUARD], {}, live({"a": GuardState(probing=True)}), "a", "default"),
    Row(
        "guard-other-variant-chosen",
        [GUARD, CANARY],
        {"canary_bucket": 0.0},
        live({"a": TRIPPED}),
        "b",
        "canary-b",
        ("p", "a"),
    ),
    Row("guard-stale-state-ignored", [], {}, live({"a": TRIPPED}), "a", "default"),
    Row(
        "guard-nothing-better",
        [GUARD],
        {},
        live({"a": TRIPPED}, b=DOWN, p=DOWN),
        "a",
        "default",
        (),
    ),
    Row(
        "guard-fallback-down",
        [GUARD],
        {},
        live({"a": TRIPPED}, b=DOWN),
        "p",
        "a-acceptance",
        ("a",),
    ),
    # Parameters a speculative engine refuses.
    Row("min-p-to-plain", [LOAD], {"min_p": 0.1}, live(), "p", "unsupported-params", ()),
    Row("logit-bias-to-plain", [], {"has_logit_bias": True}, live(), "p", "unsupported-params"),
    Row("min-p-zero-is-fine", [], {"min_p": 0.0}, live(), "a", "default"),
    Row(
        "min-p-default-injected",
        [],
        {},
        live(),
        "p",
        "unsupported-params",
        route={"defaults": {"min_p": 0.05}},
    ),
    Row(
        "min-p-plain-down",
        [],
        {"min_p": 0.1},
        live(p=DOWN),
        None,
        "unsupported-params",
        extra={
            "rejection.status": 400,
            "rejection.message": UNSUPPORTED_WITH_SPECULATION,
            "rejection.type": "BadRequestError",
        },
    ),
    Row(
        "min-p-allowed-all-down",
        [],
        {"client": "pinner", "min_p": 0.1},
        live(a=DOWN, b=DOWN),
        None,
        "no-backend",
        extra={"rejection.status": 503},
    ),
    Row(
        "min-p-all-down",
        [],
        {"min_p": 0.1},
        live(a=DOWN, b=DOWN, p=DOWN),
        None,
        "no-backend",
        extra={"rejection.status": 503},
    ),
    # Clients' allowed variants.
    Row("allowed-moves", [], {"client": "plain-only"}, live(), "p", "allowed-variants", ()),
    Row(
        "allowed-none-on-route",
        [],
        {"client": "embed-only"},
        live(),
        None,
        "allowed-variants",
        extra={"rejection.status": 403, "rejection.type": "PermissionDeniedError"},
    ),
    Row("allowed-restricts-retries", [], {"client": "pinner"}, live(), "a", "default", ("b",)),
    Row(
        "allowed-and-min-p",
        [],
        {"client": "pinner", "min_p": 0.5},
        live(),
        None,
        "unsupported-params",
        extra={"rejection.status": 400},
    ),
    # Pinned variant.
    Row(
        "pin",
        [LOAD, CANARY],
        {"client": "pinner", "pinned_variant": "b"},
        live(),
        "b",
        "pinned",
        ("a",),
    ),
    Row(
        "pin-guard-exempt",
        [GUARD],
        {"client": "pinner", "pinned_variant": "a"},
        live({"a": TRIPPED}),
        "a",
        "pinned",
    ),
    Row(
        "pin-down-moves",
        [],
        {"client": "pinner", "pinned_variant": "a"},
        live(a=DOWN),
        "b",
        "health",
    ),
    Row(
        "pin-not-allowed-to-pin",
        [],
        {"pinned_variant": "b"},
        live(),
        None,
        "pinned",
        extra={"rejection.status": 403, "rejection.param": "X-Specrouter-Variant"},
    ),
    Row(
        "pin-unknown-client",
        [],
        {"client": "stranger", "pinned_variant": "b"},
        live(),
        None,
        "pinned",
        extra={"rejection.status": 403},
    ),
    Row(
        "pin-unknown-variant",
        [],
        {"client": "pinner", "pinned_variant": "z"},
        live(),
        None,
        "pinned",
        extra={"rejection.status": 400},
    ),
    Row(
        "pin-variant-not-allowed",
        [],
        {"client": "pinner", "pinned_variant": "p"},
        live(),
        None,
        "pinned",
        extra={"rejection.status": 403},
    ),
    # Routes and tasks.
    Row("alias", [], {"model": "qwen"}, live(), "a", "default", extra={"route": "coder"}),
    Row(
        "unknown-model",
        [],
        {"model": "gpt-5"},
        live(),
        None,
        "unknown-model",
        extra={
            "route": "",
            "rejection.status": 404,
            "rejection.param": "model",
            "rejection.type": "NotFoundError",
            "rejection.message": "The model `gpt-5` does not exist. "
            "Available models: coder, qwen, emb.",
        },
    ),
    Row(
        "embeddings-on-generate-route",
        [],
        {"endpoint": "embeddings"},
        live(),
        None,
        "wrong-task",
        extra={"rejection.status": 400},
    ),
    Row(
        "chat-on-embed-route",
        [],
        {"model": "emb"},
        live(),
        None,
        "wrong-task",
        extra={
            "rejection.status": 400,
            "rejection.message": "The model `emb` is an embedding model; "
            "it does not serve /v1/chat/completions.",
        },
    ),
    Row(
        "embeddings",
        [],
        {"model": "emb", "endpoint": "embeddings"},
        live(),
        "e",
        "default",
        (),
        extra={"content_class": None, "inject": {}},
    ),
    Row("responses-endpoint", [], {"endpoint": "responses"}, live(), "a", "default"),
    # Priority: only where the engine schedules by it, only for known clients.
    Row(
        "priority-on-b",
        [CANARY],
        {"canary_bucket": 0.0},
        live(),
        "b",
        "canary-b",
        extra={"priority": 3},
    ),
    Row("priority-not-on-a", [], {}, live(), "a", "default", extra={"priority": None}),
    Row(
        "priority-unknown-client",
        [CANARY],
        {"client": "stranger", "canary_bucket": 0.0},
        live(),
        "b",
        "canary-b",
        extra={"priority": None},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_decide(row: Row) -> None:
    policy = make_policy(row.rules, **row.route)
    decision = decide(view(**row.request), row.state, policy)
    assert (decision.backend, decision.reason) == (row.backend, row.reason)
    if row.fallbacks is not None:
        assert decision.fallbacks == row.fallbacks
    for path, expected in row.extra.items():
        value: Any = decision
        for part in path.split("."):
            value = getattr(value, part)
        assert value == expected, path
    if decision.rejection is None:
        assert decision.backend not in decision.fallbacks
    # explain=True decides the same, and gives every rule a verdict.
    explained = decide(view(**row.request), row.state, policy, explain=True)
    assert replace(explained, verdicts=()) == decision
    if decision.rejection is None:
        named = {v.rule for v in explained.verdicts}
        assert {r["name"] for r in row.rules} <= named
        assert explained.verdicts[-1].verdict == decision.backend


# Defaults: only absent fields; class over route, client over both; clamps on the client's value.

DEFAULTS_ROUTE: dict[str, Any] = {
    "defaults": {"temperature": 0.7, "top_p": 0.95},
    "defaults_by_class": {"code": {"temperature": 0.6}},
    "clamps": {"max_tokens": {"min": 16, "max": 1000}, "top_k": {"max": 50}},
}


@pytest.mark.parametrize(
    ("request_", "inject", "applied", "clamped"),
    [
        ({"signals": PROSE}, {"temperature": 0.7, "top_p": 0.95}, ("temperature", "top_p"), ()),
        ({}, {"temperature": 0.6, "top_p": 0.95}, ("temperature", "top_p"), ()),
        ({"temperature": 1.0}, {"top_p": 0.95}, ("top_p",), ()),
        ({"client": "tuned"}, {"temperature": 0.6, "top_p": 0.8}, ("temperature", "top_p"), ()),
        (
            {"client": "stranger", "signals": PROSE},
            {"temperature": 0.7, "top_p": 0.95},
            ("temperature", "top_p"),
            (),
        ),
        ({"fields_set": frozenset({"temperature", "top_p"})}, {}, (), ()),
        (
            {"numeric_fields": {"max_tokens": 5000}, "fields_set": frozenset({"max_tokens"})},
            {"temperature": 0.6, "top_p": 0.95, "max_tokens": 1000},
            ("temperature", "top_p"),
            ("max_tokens",),
        ),
        (
            {"numeric_fields": {"max_tokens": 4}},
            {"temperature": 0.6, "top_p": 0.95, "max_tokens": 16},
            ("temperature", "top_p"),
            ("max_tokens",),
        ),
        (
            {"numeric_fields": {"max_tokens": 500}},
            {"temperature": 0.6, "top_p": 0.95},
            ("temperature", "top_p"),
            (),
        ),
        (
            {"numeric_fields": {"top_k": 80.5}},
            {"temperature": 0.6, "top_p": 0.95, "top_k": 50.0},
            ("temperature", "top_p"),
            ("top_k",),
        ),
    ],
    ids=[
        "prose",
        "code-class",
        "client-temperature-kept",
        "client-defaults",
        "unknown-client",
        "all-set",
        "clamp-max",
        "clamp-min",
        "clamp-within",
        "clamp-float",
    ],
)
def test_defaults_and_clamps(
    request_: dict[str, Any],
    inject: dict[str, Any],
    applied: tuple[str, ...],
    clamped: tuple[str, ...],
) -> None:
    policy = make_policy(**DEFAULTS_ROUTE)
    decision = decide(view(**request_), live(), policy)
    assert decision.inject == inject
    assert decision.defaults_applied == applied
    assert decision.clamped == clamped
    if "max_tokens" in inject:
        assert type(inject["max_tokens"]) is int  # vLLM refuses a float max_tokens


def test_decide_is_pure() -> None:
    policy = make_policy([LOAD, CANARY, GUARD])
    request, state = view(canary_bucket=0.3), live({"a": TRIPPED}, b=BackendState(in_flight=4))
    first = decide(request, state, policy)
    assert all(decide(request, state, policy) == first for _ in range(5))


def test_canary_bucket_is_stable_and_spread() -> None:
    assert canary_bucket("demo-agent") == canary_bucket("demo-agent")
    buckets = [canary_bucket(f"client-{i}") for i in range(2000)]
    assert all(0.0 <= b < 1.0 for b in buckets)
    share = sum(b < 0.10 for b in buckets) / len(buckets)
    assert 0.08 < share < 0.12


def test_explain_verdicts() -> None:
    policy = make_policy([HEALTH_DOWN_ONLY, GUARD, CONTENT, HOT, LOAD, VIP])
    state = live({"a": TRIPPED}, a=BackendState(acceptance=2.1), p=DOWN)
    decision = decide(view(temperature=0.7), state, policy, explain=True)
    got = {v.rule: (v.verdict, v.detail) for v in decision.verdicts}
    assert decision.backend == "b" and decision.reason == "a-acceptance"
    assert got["classify"] == ("code", "tools")
    assert got["defaults"] == ("none", "")
    assert got["prose-to-p"][0] == "no-match"
    assert got["hot"] == ("no-match", "temperature 0.7 not in [1, inf)")
    assert got["deep"][0] == "matched" and "overridden by a-acceptance" in got["deep"][1]
    assert got["vip-plain"] == ("not-evaluated", "an earlier rule decided")
    assert got["a-acceptance"] == ("applied", "a tripped (acceptance 2.1)")
    assert got["hc"] == ("ok", "unavailable: p")
    assert got["result"] == ("b", "moved by a-acceptance")


@pytest.mark.parametrize(
    ("rules", "request_", "state", "rule", "verdict", "detail"),
    [
        (
            [GUARD, CANARY],
            {"canary_bucket": 0.0},
            live({"a": TRIPPED}),
            "a-acceptance",
            "tripped",
            "a not chosen (no reading)",
        ),
        (
            [GUARD],
            {},
            live({"a": GuardState(probing=True)}, a=BackendState(acceptance=3.0)),
            "a-acceptance",
            "ok",
            "acceptance 3 vs below 2.8; on trial",
        ),
        ([], {}, live(a=DOWN), "health", "applied", "unavailable: a"),
        ([], {}, live(), "health", "ok", "all variants available"),
        (
            [LOAD],
            {"client": "pinner", "pinned_variant": "b"},
            live(),
            "deep",
            "not-evaluated",
            "the variant is pinned",
        ),
        (
            [LOAD],
            {"client": "pinner", "pinned_variant": "b"},
            live(),
            "pinned",
            "matched",
            "X-Specrouter-Variant: b",
        ),
        (
            [{**LOAD, "scope": "route"}],
            {},
            live(b=BackendState(in_flight=3)),
            "deep",
            "matched",
            "in_flight on route: 3 + this request vs at most 2 -> b",
        ),
        (
            [CONTENT],
            {
                "signals": ContentSignals(
                    code_in_recent_messages=True, system_prompt_mentions_code=True
                )
            },
            live(),
            "classify",
            "code",
            "code in recent messages, system prompt about code",
        ),
        (
            [CONTENT],
            {"signals": PROSE},
            live(),
            "prose-to-p",
            "matched",
            "class prose vs prose -> p",
        ),
        (
            [COOL],
            {"temperature": 0.1},
            live(),
            "cool",
            "matched",
            "temperature 0.1 in [-inf, 0.7) -> p",
        ),
        (
            [CANARY],
            {"canary_bucket": 0.5},
            live(),
            "canary-b",
            "no-match",
            "bucket 50.00 % vs 10 %",
        ),
        ([VIP], {}, live(), "vip-plain", "no-match", "client agent vs vip"),
        (
            [],
            {"client": "plain-only"},
            live(),
            "allowed-variants",
            "applied",
            "the chosen variant cannot serve this",
        ),
        (
            [],
            {"min_p": 0.2},
            live(),
            "unsupported-params",
            "applied",
            "the chosen variant cannot serve this",
        ),
        (
            [],
            {"numeric_fields": {"max_tokens": 10**6}},
            live(),
            "defaults",
            "applied",
            "temperature; clamped max_tokens",
        ),
    ],
)
def test_explain_rows(
    rules: list[dict[str, Any]],
    request_: dict[str, Any],
    state: LiveState,
    rule: str,
    verdict: str,
    detail: str,
) -> None:
    policy = make_policy(rules, clamps={"max_tokens": {"max": 32768}})
    decision = decide(view(**request_), state, policy, explain=True)
    got = {v.rule: (v.verdict, v.detail) for v in decision.verdicts}
    assert got[rule] == (verdict, detail)


def test_gb10_three_policy_moves_with_load() -> None:
    from pathlib import Path

    from policies.schema import compile_policy, load_policy

    root = Path(__file__).resolve().parents[2] / "loadtests" / "bench" / "sweep"
    policy = compile_policy(load_policy(root / "gb10-three.yaml"))
    request = RequestView(endpoint="chat", model="qwen3.8-27b", client="coding-agent")
    quiet = decide(request, LiveState(), policy)
    busy = decide(request, LiveState(backends={"coder-dflash7": BackendState(in_flight=2)}), policy)
    assert (quiet.backend, busy.backend) == ("coder-dflash7", "coder-dflash5")
    assert quiet.inject == {"temperature": 0.7}


def _decision_fields() -> set[str]:
    return set(Decision.__dataclass_fields__)


def test_decision_contract_kept() -> None:
    # The gateway is written against these names; extending is fine, renaming is not.
    assert {
        "route",
        "backend",
        "reason",
        "inject",
        "defaults_applied",
        "fallbacks",
        "content_class",
        "canary",
        "priority",
        "rejection",
        "verdicts",
    } <= _decision_fields()
