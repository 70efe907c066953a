"""The policy engine: (request view, live state, compiled policy) -> decision. Pure.

No I/O, no clock, no randomness: the time (`view.now`) and the canary bucket
(`view.canary_bucket`, from `canary_bucket(client)`) are inputs, so the same inputs always give
the same decision and every case is a row in a table test.

How a decision is made, in order:
1. The route: `view.model` names a route (404 naming the available models otherwise), whose task
   must match the endpoint (400 otherwise).
2. The content class (generate routes): `policies.classify.classify(view.signals)`.
3. Injected parameters: the route's defaults, overridden by its class defaults, overridden by the
   client's, each set only when the client did not send the field; then the route's clamps on the
   client's own numeric fields.
4. The choice: a pinned variant (X-Specrouter-Variant, clients with `may_pin` only), else the
   first selector rule (load, content, sampling, canary, client) that matches, in document
   order, else the route's first variant (reason `default`).
4b. The session (`view.session`, policies/sessions.py): a continuing session stays on the engine
   holding its prefix (reason `session` when the rules chose another) unless that engine cannot serve (the constraint's
   name) or moving to the rules' choice pays (`session-move`, policies/stickiness.py).
5. Constraints on the choice, whichever rule made it: a variant the client may not use
   (`allowed-variants`), an unavailable backend (the health rule's name, `health` by default),
   a speculative backend whose engine kind refuses the request's sampling fields
   (policies/capabilities.py; `unsupported-params`),
   a tripped acceptance guard (the guard's name; a pinned variant is exempt). A constrained
   choice moves to the guard's fallback, then the route's fallback, then the other variants;
   the constraint becomes the reason.
6. `fallbacks`: the other usable variants, in that order, for a retry before the first byte.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from policies.classify import classify
from policies.compiled import CompiledPolicy, CompiledRoute
from policies.explain import verdicts_for
from policies.fairness import request_priority
from policies.predicates import SELECT, is_available, is_tripped
from policies.spec.rules import Rule
from policies.stickiness import MoveCost, move_cost
from policies.types import Decision, LiveState, Rejection, RequestView, RuleVerdict, SessionView

# vLLM's own words (vllm/v1/engine/processor.py) so a client sees what the engine would have said.
UNSUPPORTED_WITH_SPECULATION: Final = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)
# Each endpoint's path, for a wrong-task refusal that names what was asked.
_PATHS: Final = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "responses": "/v1/responses",
    "messages": "/v1/messages",
}
# An engine that is down or starting: the cold start is minutes, a client should not spin.
RETRY_AFTER_UNAVAILABLE_S: Final = 5.0


def canary_bucket(key: str) -> float:
    """A stable position in [0, 1) for `key` (the client's name): the same client always lands
    on the same side of a canary's percentage, whatever process computes it."""
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def decide(
    view: RequestView, state: LiveState, policy: CompiledPolicy, *, explain: bool = False
) -> Decision:
    """Choose the backend, the parameters to inject and the reason for one request.

    With `explain=True` the decision also carries every rule's verdict (for the admin API and
    `specrouter policy explain`); the request path leaves it off, it costs more than the rest.
    """
    route = policy.route_for_model(view.model)
    if route is None:
        return _unknown_model(view, policy)
    if (route.task == "embed") != (view.endpoint == "embeddings"):
        return _reject(
            route,
            "wrong-task",
            400,
            "BadRequestError",
            "model",
            f"The model `{view.model}` is "
            f"{'an embedding' if route.task == 'embed' else 'a text-generation'} model; "
            f"it does not serve {_PATHS[view.endpoint]}.",
        )
    client = policy.client(view.client)
    allowed = route.allowed_for(view.client) if client is not None else route.variants
    if not allowed:
        return _reject(
            route,
            "allowed-variants",
            403,
            "PermissionDeniedError",
            "model",
            f"Client `{view.client}` may not use the model `{view.model}`.",
        )

    content_class = classify(view.signals) if route.task == "generate" else None
    inject, applied, clamped = _parameters(view, route, content_class)
    temperature = _effective_temperature(view, route, inject)
    min_p = view.min_p if "min_p" in view.fields_set else inject.get("min_p")
    sampling = frozenset(
        (["logit_bias"] if view.has_logit_bias else [])
        + (["min_p"] if min_p is not None and min_p > 0 else [])
    )

    # The choice.
    pinned = view.pinned_variant
    decided_by: Rule | None = None
    if pinned is not None:
        refused = _refuse_pin(view, route, client is not None and client.may_pin, allowed)
        if refused is not None:
            return refused
        choice, reason = pinned, "pinned"
    else:
        choice, reason = route.variants[0], "default"
        for rule in route.selectors:
            picked = SELECT[rule.kind](rule, view, state, route, content_class, temperature)
            if picked is not None:
                choice, reason, decided_by = picked, rule.name, rule
                break

    # The session's engine, unless it cannot serve or a move pays (policies/stickiness.py).
    session_why: MoveCost | str | None = None
    if pinned is None and view.session is not None and policy.sessions.sticky:
        choice, reason, session_why = _stick(
            view, view.session, choice, reason, route, state, policy, allowed, sampling
        )

    # Constraints, then the retry order.
    blocked = _blocked_by(choice, route, state, allowed, sampling, guarded=pinned is None)
    usable = _usable(route, state, allowed, sampling, first=_guard_fallback(route, blocked))
    if blocked is not None:
        if not usable:
            return _no_backend(view, route, state, allowed, sampling)
        if usable[0] != choice:  # a tripped choice with nothing better stays, reason and all
            choice, reason = usable[0], blocked
        else:
            blocked = None
    fallbacks = tuple(v for v in usable if v != choice)

    priority, priority_why = None, ""
    if policy.backend(choice).priority_scheduling:
        # The client's priority, then fairness among sessions (policies/fairness.py).
        priority, priority_why = request_priority(
            view,
            client.priority if client is not None else None,
            policy.document.fairness,
            policy.sessions.subagent_priority,
            explain=explain,
        )
    verdicts: tuple[RuleVerdict, ...] = ()
    if explain:
        verdicts = verdicts_for(
            view, state, route, content_class, temperature, blocked, choice, applied, clamped
        )
        if session_why is not None and view.session is not None:
            verdict = _session_verdict(session_why, view.session, reason)
            verdicts = (*verdicts[:-1], verdict, verdicts[-1])
        if priority_why:
            verdict = RuleVerdict("fairness", f"priority {priority}", priority_why)
            verdicts = (*verdicts[:-1], verdict, verdicts[-1])
    return Decision(
        route=route.name,
        backend=choice,
        reason=reason,
        inject=inject,
        defaults_applied=applied,
        fallbacks=fallbacks,
        content_class=content_class,
        canary=decided_by is not None and decided_by.kind == "canary" and reason == decided_by.name,
        priority=priority,
        verdicts=verdicts,
        clamped=clamped,
    )


# Parameters ------------------------------------------------------------------------------------


def _parameters(
    view: RequestView, route: CompiledRoute, content_class: str | None
) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...]]:
    inject: dict[str, Any] = {}
    fields_set = view.fields_set
    for key, value in route.defaults_for(view.client, content_class):
        if key not in fields_set:  # a value the client set is the client's
            inject[key] = value
    applied = tuple(inject)
    clamped: list[str] = []
    for key, low, high in route.clamps:
        value = view.numeric_fields.get(key)
        if value is None:
            continue
        if low is not None and value < low:
            inject[key] = _like(value, low)
            clamped.append(key)
        elif high is not None and value > high:
            inject[key] = _like(value, high)
            clamped.append(key)
    return inject, applied, tuple(clamped)


def _like(value: float, bound: float) -> float:
    # max_tokens must stay an int for vLLM; a YAML bound of 32768 may arrive as 32768.0.
    return int(bound) if isinstance(value, int) and float(bound).is_integer() else bound


def _effective_temperature(
    view: RequestView, route: CompiledRoute, inject: Mapping[str, Any]
) -> float:
    if view.temperature is not None:
        return view.temperature
    injected = inject.get("temperature")
    if injected is not None:
        return float(injected)
    return route.spec.model_default_temperature


# Sessions --------------------------------------------------------------------------------------


def _stick(
    view: RequestView,
    session: SessionView,
    choice: str,
    reason: str,
    route: CompiledRoute,
    state: LiveState,
    policy: CompiledPolicy,
    allowed: tuple[str, ...],
    sampling: frozenset[str],
) -> tuple[str, str, MoveCost | str]:
    """(choice, reason, why): the held engine when it can serve and a move does not pay; the
    rules' choice for a new session, or when the held engine cannot serve (then the reason is
    the constraint that moved the session: health, the guard). `why` becomes the explain
    verdict, formatted only when asked for (`_session_verdict`).

    A turn-state token's engine (`view.turn_engine`) holds the turn whatever the table says; a
    request that keeps its place (compaction, auxiliary) stays without weighing a move."""
    held = session.engine
    turn = view.turn_engine
    if turn is not None and turn in route.variants:
        held = turn
    if held is None or held not in route.variants:
        return choice, reason, "new"
    held_blocked = _blocked_by(held, route, state, allowed, sampling, guarded=True)
    if held_blocked is not None:
        return choice, held_blocked, f"moved: {held} {held_blocked}"
    if choice == held:  # the rules agree: their reason stands, `session` counts overrides
        return held, reason, "stay"
    if held == turn:
        return held, "turn-state", f"kept: {held} serves this turn (turn-state token)"
    if view.keeps_place:
        return (
            held,
            "session",
            f"kept: {held} holds the prefix; a compaction or auxiliary request never moves a session",
        )
    move = move_cost(
        session,
        held,
        policy.backend(held),
        choice,
        policy.backend(choice),
        policy.sessions.default_turns,
    )
    if move.pays:
        return choice, "session-move", move
    return held, "session", move


def _session_verdict(why: MoveCost | str, session: SessionView, reason: str) -> RuleVerdict:
    if isinstance(why, MoveCost):
        return RuleVerdict("session", "move" if why.pays else "stay", why.explain())
    if why == "new":
        return RuleVerdict("session", "new", f"placed by {reason}")
    if why == "stay":
        return RuleVerdict("session", "stay", f"{session.engine} holds the prefix")
    verdict, _, detail = why.partition(": ")
    return RuleVerdict("session", verdict, detail)


# Constraints -----------------------------------------------------------------------------------


def _blocked_by(
    choice: str,
    route: CompiledRoute,
    state: LiveState,
    allowed: tuple[str, ...],
    sampling: frozenset[str],
    *,
    guarded: bool,
) -> str | None:
    """The name of the constraint that stops `choice` from serving, or None."""
    if choice not in allowed:
        return "allowed-variants"
    if not is_available(choice, route, state):
        return route.health_reason
    if refuses(route, choice, sampling):
        return "unsupported-params"
    if guarded and is_tripped(choice, route, state):
        return route.guards[choice].rule.name
    return None


def refuses(route: CompiledRoute, name: str, sampling: frozenset[str]) -> bool:
    """The variant's engine refuses one of these sampling fields while it speculates
    (policies/capabilities.py: vLLM's min_p / logit_bias limit, not llama.cpp's)."""
    return bool(sampling) and not sampling.isdisjoint(route.refused_sampling.get(name, ()))


def _guard_fallback(route: CompiledRoute, blocked: str | None) -> str | None:
    if blocked is None:
        return None
    for binding in route.guards.values():
        if binding.rule.name == blocked:
            return binding.fallback
    return None


def _usable(
    route: CompiledRoute,
    state: LiveState,
    allowed: tuple[str, ...],
    sampling: frozenset[str],
    first: str | None,
) -> tuple[str, ...]:
    """Variants that can serve, in the order to try them. A tripped guard's variant still
    serves (low acceptance is slow, not wrong) but only after every untripped one."""
    order = route.preference if first is None else (first, *route.preference)
    good: list[str] = []
    tripped: list[str] = []
    for name in order:
        if name in good or name in tripped or name not in allowed:
            continue
        if not is_available(name, route, state) or refuses(route, name, sampling):
            continue
        (tripped if is_tripped(name, route, state) else good).append(name)
    return tuple(good + tripped)


# Rejections ------------------------------------------------------------------------------------


def _reject(
    route: CompiledRoute | None,
    reason: str,
    status: int,
    type_: str,
    param: str | None,
    message: str,
    retry_after_s: float | None = None,
) -> Decision:
    return Decision(
        route="" if route is None else route.name,
        backend=None,
        reason=reason,
        rejection=Rejection(status, type_, message, param, retry_after_s),
    )


def _unknown_model(view: RequestView, policy: CompiledPolicy) -> Decision:
    names = ", ".join(policy.model_names())
    return _reject(
        None,
        "unknown-model",
        404,
        "NotFoundError",
        "model",
        f"The model `{view.model}` does not exist. Available models: {names}.",
    )


def _refuse_pin(
    view: RequestView, route: CompiledRoute, may_pin: bool, allowed: tuple[str, ...]
) -> Decision | None:
    pinned = view.pinned_variant
    if not may_pin:
        return _reject(
            route,
            "pinned",
            403,
            "PermissionDeniedError",
            "X-Specrouter-Variant",
            f"Client `{view.client}` may not choose a variant.",
        )
    if pinned not in route.variants:
        return _reject(
            route,
            "pinned",
            400,
            "BadRequestError",
            "X-Specrouter-Variant",
            f"The model `{view.model}` has no variant `{pinned}`. "
            f"Variants: {', '.join(route.variants)}.",
        )
    if pinned not in allowed:
        return _reject(
            route,
            "pinned",
            403,
            "PermissionDeniedError",
            "X-Specrouter-Variant",
            f"Client `{view.client}` may not use the variant `{pinned}`.",
        )
    return None


def _no_backend(
    view: RequestView,
    route: CompiledRoute,
    state: LiveState,
    allowed: tuple[str, ...],
    sampling: frozenset[str],
) -> Decision:
    if any(is_available(v, route, state) for v in allowed if refuses(route, v, sampling)):
        # Something is up but every such engine speculates: answer what vLLM would, no round trip.
        return _reject(
            route, "unsupported-params", 400, "BadRequestError", None, UNSUPPORTED_WITH_SPECULATION
        )
    return _reject(
        route,
        "no-backend",
        503,
        "ServiceUnavailableError",
        None,
        f"No backend for the model `{view.model}` is available right now.",
        RETRY_AFTER_UNAVAILABLE_S,
    )
