"""The route's output-token clamp holds under every name a client may give that field, and a
route with no such clamp still caps output at its variants' context length."""

from __future__ import annotations

from typing import Any

import pytest

from policies.compiled import CompiledPolicy
from policies.engine import decide
from policies.inputs import for_body, request_view
from policies.schema import validate_policy
from policies.types import LiveState

KEY = "0" * 63


def _policy(
    clamps: dict[str, Any], lengths: tuple[int | None, ...] = (None, None)
) -> CompiledPolicy:
    backends = {}
    for name, length in zip(("a", "b"), lengths, strict=True):
        backends[name] = {"url": f"http://127.0.0.1:{len(backends) + 1}", "served_model_name": "m"}
        if length is not None:
            backends[name]["engine"] = {"max_model_len": length}
    return CompiledPolicy(
        validate_policy(
            {
                "schema": 1,
                "backends": backends,
                "routes": {
                    "coder": {"models": ["coder"], "variants": ["a", "b"], "clamps": clamps}
                },
                "clients": [{"name": "agent", "key_sha256": KEY + "1"}],
            }
        )
    )


def _inject(policy: CompiledPolicy, body: dict[str, Any], endpoint: Any = "chat") -> dict[str, Any]:
    """What the gateway injects: the decision, spelled as the request spells the field."""
    full = {"model": "coder", **body}
    view = request_view(full, endpoint, "coder", "agent", {}, 0.0)
    return dict(for_body(decide(view, LiveState(), policy), endpoint, full).inject)


@pytest.mark.parametrize(
    ("name", "endpoint"),
    [("max_tokens", "chat"), ("max_completion_tokens", "chat"), ("max_output_tokens", "responses")],
)
def test_a_clamp_on_one_name_holds_under_every_name(name: str, endpoint: str) -> None:
    policy = _policy({"max_tokens": {"max": 256}})
    assert _inject(policy, {name: 600}, endpoint) == {name: 256}
    assert _inject(policy, {name: 100}, endpoint) == {}


def test_the_tightest_of_several_names_wins() -> None:
    policy = _policy({"max_tokens": {"max": 1000}, "max_completion_tokens": {"min": 8, "max": 256}})
    assert _inject(policy, {"max_tokens": 600}) == {"max_tokens": 256}
    assert _inject(policy, {"max_output_tokens": 2}, "responses") == {"max_output_tokens": 8}


def test_without_a_clamp_output_is_capped_at_the_context_length() -> None:
    assert _inject(_policy({}, (8192, 4096)), {"max_tokens": 10**6}) == {"max_tokens": 4096}
    # A variant whose context length the policy does not state: no cap the gateway can know.
    assert _inject(_policy({}, (8192, None)), {"max_tokens": 10**6}) == {}


def test_a_boolean_or_a_string_is_no_number() -> None:
    view = request_view(
        {"temperature": True, "n": True, "max_tokens": "600"}, "chat", "coder", "agent", {}, 0.0
    )
    assert view.temperature is None and view.n == 1 and view.numeric_fields == {}
