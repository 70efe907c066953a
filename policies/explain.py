"""Every rule's verdict for one decision, for `decide(..., explain=True)`.

Kept apart from the engine because the request path never needs it: it re-evaluates each rule to
say why it matched or not, which costs several times the decision itself.

`session_from_row` reads a session table row given by hand, for `specrouter policy explain
--session` and the admin API's explain alike: the stickiness arithmetic (stay or move: the
predicted decode gain over the expected remaining turns against the re-prefill cost) is then the
`session` verdict of the decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from policies.compiled import CompiledRoute
from policies.predicates import SELECT, is_available, is_tripped, load_count, temperature_in_range
from policies.spec.rules import (
    SELECTOR_KINDS,
    CanaryRule,
    ClientRule,
    ContentRule,
    GuardRule,
    HealthRule,
    LoadRule,
    Rule,
    SamplingRule,
)
from policies.types import LiveState, RequestView, RuleVerdict, SessionView

SESSION_FIELDS: Final = (
    "engine",
    "prefix_tokens",
    "turns",
    "out_tokens_per_turn",
    "mean_turns",
    "subagent",
    "attained_tokens",
)


def session_from_row(key: str, row: Mapping[str, Any]) -> SessionView:
    """The session table's row for `key`, as JSON gives it; TypeError names what is wrong."""
    unknown = sorted(set(row) - set(SESSION_FIELDS))
    if unknown:
        raise TypeError(
            f"unknown field(s) {', '.join(unknown)}; known: {', '.join(SESSION_FIELDS)}"
        )
    engine, mean = row.get("engine"), row.get("mean_turns")
    if engine is not None and not isinstance(engine, str):
        raise TypeError("engine must be a backend name or null")
    try:
        return SessionView(
            key,
            _boolean(row.get("subagent", False)),
            engine,
            _count(row.get("prefix_tokens", 0), "prefix_tokens"),
            _count(row.get("turns", 0), "turns"),
            _number(row.get("out_tokens_per_turn", 0.0), "out_tokens_per_turn"),
            None if mean is None else _number(mean, "mean_turns"),
            _count(row.get("attained_tokens", 0), "attained_tokens"),
        )
    except ValueError as exc:
        raise TypeError(str(exc)) from None


def _boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("subagent must be true or false")
    return value


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a count (an integer >= 0)")
    return value


def _number(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"{name} must be a number >= 0")
    return float(value)


def verdicts_for(
    view: RequestView,
    state: LiveState,
    route: CompiledRoute,
    content_class: str | None,
    temperature: float,
    blocked: str | None,
    final: str,
    applied: tuple[str, ...],
    clamped: tuple[str, ...],
) -> tuple[RuleVerdict, ...]:
    out = [
        RuleVerdict("classify", str(content_class), _signals(view)),
        RuleVerdict(
            "defaults",
            "applied" if applied else "none",
            ", ".join(applied) + (f"; clamped {', '.join(clamped)}" if clamped else ""),
        ),
        RuleVerdict("temperature", f"{temperature:g}", "effective, after defaults"),
    ]
    if view.pinned_variant is not None:
        out.append(RuleVerdict("pinned", "matched", f"X-Specrouter-Variant: {view.pinned_variant}"))
    decided = False
    for rule in route.spec.rules:
        if rule.kind in SELECTOR_KINDS:
            if view.pinned_variant is not None:
                out.append(RuleVerdict(rule.name, "not-evaluated", "the variant is pinned"))
            elif decided:
                out.append(RuleVerdict(rule.name, "not-evaluated", "an earlier rule decided"))
            else:
                picked = SELECT[rule.kind](rule, view, state, route, content_class, temperature)
                detail = _why(rule, view, state, route, content_class, temperature)
                if picked is None:
                    out.append(RuleVerdict(rule.name, "no-match", detail))
                else:
                    decided = True  # the first match decides; the engine stopped here too
                    overridden = f"; overridden by {blocked}" if blocked is not None else ""
                    out.append(
                        RuleVerdict(rule.name, "matched", f"{detail} -> {picked}{overridden}")
                    )
        elif isinstance(rule, GuardRule):
            out.append(_guard_verdict(rule, state, route, blocked))
        elif isinstance(rule, HealthRule):
            out.append(_health_verdict(rule.name, state, route, blocked))
    if route.health_reason == "health":  # the built-in health check, when no rule names it
        out.append(_health_verdict("health", state, route, blocked))
    for builtin in ("allowed-variants", "unsupported-params"):
        if blocked == builtin:
            out.append(RuleVerdict(builtin, "applied", "the chosen variant cannot serve this"))
    out.append(RuleVerdict("result", final, "" if blocked is None else f"moved by {blocked}"))
    return tuple(out)


def _signals(view: RequestView) -> str:
    s = view.signals
    names = [
        name
        for name, on in (
            ("tools", s.tools_declared),
            ("code in recent messages", s.code_in_recent_messages),
            ("system prompt about code", s.system_prompt_mentions_code),
        )
        if on
    ]
    return ", ".join(names) or "no code signal"


def _why(
    rule: Rule,
    view: RequestView,
    state: LiveState,
    route: CompiledRoute,
    content_class: str | None,
    temperature: float,
) -> str:
    if isinstance(rule, LoadRule):
        count = load_count(rule, state, route)
        where = "route" if rule.scope == "route" else rule.use
        return f"{rule.count} on {where}: {count} + this request vs at most {rule.max_in_flight}"
    if isinstance(rule, ContentRule):
        return f"class {content_class} vs {', '.join(rule.classes)}"
    if isinstance(rule, SamplingRule):
        low = "-inf" if rule.temperature_at_least is None else f"{rule.temperature_at_least:g}"
        high = "inf" if rule.temperature_below is None else f"{rule.temperature_below:g}"
        inside = "in" if temperature_in_range(rule, temperature) else "not in"
        return f"temperature {temperature:g} {inside} [{low}, {high})"
    if isinstance(rule, CanaryRule):
        return f"bucket {view.canary_bucket * 100:.2f} % vs {rule.percent:g} %"
    assert isinstance(rule, ClientRule)
    return f"client {view.client} vs {', '.join(rule.clients)}"


def _guard_verdict(
    rule: GuardRule, state: LiveState, route: CompiledRoute, blocked: str | None
) -> RuleVerdict:
    guard = state.guards.get(rule.variant)
    acceptance = state.backends.get(rule.variant)
    reading = (
        "no reading"
        if acceptance is None or acceptance.acceptance is None
        else (f"acceptance {acceptance.acceptance:g}")
    )
    if blocked == rule.name:
        return RuleVerdict(rule.name, "applied", f"{rule.variant} tripped ({reading})")
    if is_tripped(rule.variant, route, state):
        return RuleVerdict(rule.name, "tripped", f"{rule.variant} not chosen ({reading})")
    trial = "; on trial" if guard is not None and guard.probing else ""
    return RuleVerdict(rule.name, "ok", f"{reading} vs below {rule.below:g}{trial}")


def _health_verdict(
    name: str, state: LiveState, route: CompiledRoute, blocked: str | None
) -> RuleVerdict:
    down = [v for v in route.variants if not is_available(v, route, state)]
    detail = f"unavailable: {', '.join(down)}" if down else "all variants available"
    return RuleVerdict(name, "applied" if blocked == name else "ok", detail)
