"""What a rule or a constraint tests, shared by the engine and its explanation (policies.explain).

Each selector returns the variant it picks, or None to let the next rule decide; the predicates
say whether a variant is available and whether its acceptance guard has tripped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from policies.compiled import CompiledRoute
from policies.spec.rules import SELECTOR_KINDS, LoadRule, SamplingRule
from policies.types import BackendState, LiveState, RequestView

_UNKNOWN: Final = BackendState()  # a backend the gateway has not observed yet counts as up, idle


Selector = Callable[[Any, RequestView, LiveState, CompiledRoute, str | None, float], str | None]


def load_count(rule: LoadRule, state: LiveState, route: CompiledRoute) -> int:
    """Sequences in flight that the load rule counts (this request excluded)."""
    names = route.variants if rule.scope == "route" else (rule.use,)
    total = 0
    for name in names:
        backend = state.backends.get(name, _UNKNOWN)
        if rule.count == "in_flight":
            total += backend.in_flight
        elif rule.count == "running":
            # Before the first scrape the gateway's own count is the best there is.
            total += backend.in_flight if backend.running is None else backend.running
        else:
            total += max(backend.in_flight, backend.running or 0)
    return total


def select(
    rule: Any,
    view: RequestView,
    state: LiveState,
    route: CompiledRoute,
    content_class: str | None,
    temperature: float,
) -> str | None:
    """The variant a selector rule picks, or None to let the next rule decide: its `use` when
    the rule matches; a load rule that does not match picks its `otherwise`."""
    kind = rule.kind  # a string compare: isinstance on a pydantic model goes through ABCMeta
    use: str | None = rule.use
    if kind == "load":
        # "At most N" counts this request: with N = 2, two agents share the deep variant, a
        # third goes elsewhere.
        otherwise: str | None = rule.otherwise
        return use if load_count(rule, state, route) + 1 <= rule.max_in_flight else otherwise
    if kind == "content":
        matched = content_class in rule.classes
    elif kind == "sampling":
        matched = temperature_in_range(rule, temperature)
    elif kind == "client":
        matched = view.client in rule.clients
    else:
        matched = kind == "canary" and view.canary_bucket * 100.0 < rule.percent
    return use if matched else None


def temperature_in_range(rule: SamplingRule, temperature: float) -> bool:
    """[temperature_at_least, temperature_below): the lower bound is in, the upper one out."""
    low, high = rule.temperature_at_least, rule.temperature_below
    return (low is None or temperature >= low) and (high is None or temperature < high)


# One selector serves every kind; looked up by kind (policies/engine.py, policies/explain.py).
SELECT: Final[dict[str, Selector]] = dict.fromkeys(SELECTOR_KINDS, select)


def is_available(name: str, route: CompiledRoute, state: LiveState) -> bool:
    return state.backends.get(name, _UNKNOWN).health not in route.unavailable


def is_tripped(name: str, route: CompiledRoute, state: LiveState) -> bool:
    # Only a guard the route still configures counts: after a policy edit removes a guard, its
    # last state may linger in the live state for a scrape or two.
    guard = state.guards.get(name)
    return guard is not None and guard.tripped and name in route.guards
