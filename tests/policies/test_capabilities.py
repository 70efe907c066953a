"""The engine-capability table as the policy engine reads it: vLLM's min_p / logit_bias limit on
speculation applies to vLLM engines only; llama.cpp serves those requests speculatively."""

from __future__ import annotations

from typing import Any

import pytest

from policies.capabilities import CAPABILITIES, capabilities
from policies.compiled import CompiledPolicy
from policies.engine import decide
from policies.lint import policy_warnings as lint
from policies.schema import validate_policy
from policies.types import LiveState, RequestView

DRAFT = {"method": "draft-simple", "num_speculative_tokens": 8}


def policy(variants: dict[str, dict[str, Any]], **route: Any) -> CompiledPolicy:
    backends = {
        name: {"url": f"http://127.0.0.1:{i + 1}", "served_model_name": "m", **b}
        for i, (name, b) in enumerate(variants.items())
    }
    return CompiledPolicy(
        validate_policy(
            {
                "schema": 1,
                "backends": backends,
                "routes": {"r": {"models": ["m"], "variants": list(variants), **route}},
            }
        )
    )


def view(**kw: Any) -> RequestView:
    return RequestView(
        endpoint="chat",
        model="m",
        client="c",
        fields_set=frozenset({"model", "messages", *kw}),
        **kw,
    )


def test_the_table_covers_every_kind() -> None:
    assert set(CAPABILITIES) == {"vllm", "llamacpp", "sglang", "openai"}
    assert capabilities("vllm").refused_with_speculation == {"min_p", "logit_bias"}
    assert capabilities("llamacpp").refused_with_speculation == frozenset()
    assert "timings" in capabilities("llamacpp").per_request
    assert capabilities("llamacpp").metrics_prefix == "llamacpp:"
    assert not capabilities("llamacpp").continuous_usage


@pytest.mark.parametrize("request_", [{"min_p": 0.1}, {"has_logit_bias": True}])
def test_llamacpp_speculates_with_min_p_and_logit_bias(request_: dict[str, Any]) -> None:
    mixed = policy(
        {
            "lc": {"kind": "llamacpp", "speculative": DRAFT},
            "vs": {"speculative": DRAFT},
            "plain": {},
        }
    )
    decision = decide(view(**request_), LiveState(), mixed)
    assert (decision.backend, decision.reason) == ("lc", "default")
    assert decision.fallbacks == ("plain",)  # the speculative vLLM engine would refuse it
    # A route with only speculative llama.cpp variants serves it (no 400).
    only = policy({"lc": {"kind": "llamacpp", "speculative": DRAFT}})
    assert decide(view(**request_), LiveState(), only).rejection is None


def test_vllm_speculative_still_moves_to_plain() -> None:
    vllm = policy({"vs": {"speculative": DRAFT}, "plain": {}})
    decision = decide(view(min_p=0.1), LiveState(), vllm)
    assert (decision.backend, decision.reason) == ("plain", "unsupported-params")
    only = policy({"vs": {"speculative": DRAFT}})
    rejection = decide(view(min_p=0.1), LiveState(), only).rejection
    assert rejection is not None and rejection.status == 400


def test_lint_warns_about_min_p_defaults_only_where_refused() -> None:
    defaults = {"defaults": {"min_p": 0.05}}
    lc = policy(
        {"lc": {"kind": "llamacpp", "speculative": DRAFT}, "p": {"kind": "llamacpp"}}, **defaults
    )
    vs = policy({"vs": {"speculative": DRAFT}, "p": {}}, **defaults)
    assert not any("min_p" in w for w in lint(lc.document))
    assert any("min_p" in w for w in lint(vs.document))
