"""The continuation's plan, by table: which engine next, what is resent, what the client has
seen (proxy/relay/continuation.py `plan_continuation`, pure)."""

from __future__ import annotations

from typing import Any

import pytest

from policies.spec.backends import BackendSpec
from proxy.relay.continuation import Broken, plan_continuation


def _backend(kind: str = "vllm", served: str = "qwen") -> BackendSpec:
    return BackendSpec.model_validate(
        {"url": "http://127.0.0.1:1", "kind": kind, "served_model_name": served}
    )


BACKENDS = {
    "a": _backend(),
    "b": _backend(),
    "c": _backend(),
    "llama": _backend(kind="llamacpp"),
    "other": _backend(served="other-model"),
}


@pytest.mark.parametrize(
    ("failed", "variants", "down", "steps"),
    [
        # the others of the same weights, in the route's order, never the failed one
        ("a", ("a", "b", "c"), (), (("b", None), ("c", None))),
        ("b", ("a", "b", "c"), (), (("a", None), ("c", None))),
        # one not up is skipped, not counted
        ("a", ("a", "b", "c"), ("b",), (("c", None),)),
        # another kind or other weights: refused, with the reason counted
        (
            "a",
            ("a", "llama", "other", "b"),
            (),
            (
                ("llama", "other-kind"),
                ("other", "other-weights"),
                ("b", None),
            ),
        ),
        # nothing left: no engine to ask
        ("a", ("a",), (), ()),
        ("a", ("a", "b"), ("b",), ()),
    ],
)
def test_the_plan_picks_the_next_engines(
    failed: str,
    variants: tuple[str, ...],
    down: tuple[str, ...],
    steps: tuple[tuple[str, str | None], ...],
) -> None:
    plan = plan_continuation({"messages": []}, Broken(failed, "x", 1), variants, BACKENDS, down)
    assert plan.steps == steps
    assert plan.engines == tuple(n for n, why in steps if why is None)


@pytest.mark.parametrize(
    ("limits", "generated", "resent"),
    [
        ({"max_tokens": 100}, 30, {"max_tokens": 70}),  # the budget left, not the whole again
        (
            {"max_completion_tokens": 100, "max_tokens": 50},
            30,
            {
                "max_completion_tokens": 70,
                "max_tokens": 20,
            },
        ),
        ({"max_tokens": 10}, 30, {"max_tokens": 1}),  # at least one: vLLM refuses 0
        ({}, 30, {}),  # no limit sent, none added
    ],
)
def test_the_plan_resends_what_the_client_has_seen_and_the_budget_left(
    limits: dict[str, int], generated: int, resent: dict[str, int]
) -> None:
    asked = [{"role": "user", "content": "hi"}]
    body: dict[str, Any] = {"model": "m", "messages": asked, "stream": True, **limits}
    plan = plan_continuation(body, Broken("a", "Hello, wor", generated), ("a", "b"), BACKENDS, ())
    assert plan.seen == "Hello, wor"
    assert plan.body["messages"] == [*asked, {"role": "assistant", "content": "Hello, wor"}]
    assert plan.body["continue_final_message"] is True
    assert plan.body["add_generation_prompt"] is False
    assert {k: plan.body[k] for k in limits} == resent
    assert body["messages"] == asked  # the client's request is not changed
