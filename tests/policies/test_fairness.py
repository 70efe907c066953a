"""Fairness (policies/fairness.py): features -> vLLM priority, as tables; through decide() only
on priority-scheduling engines, with the reason in explain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from policies.cli import main
from policies.compiled import compile_policy
from policies.engine import decide
from policies.fairness import attained_level, fair_priority
from policies.schema import PolicyDocument
from policies.spec.fairness import FairnessSpec
from policies.types import LiveState, RequestView, SessionView

ROOT = Path(__file__).resolve().parents[2]
SPEC = FairnessSpec(enabled=True)  # boundaries 16,384 / 65,536 / 262,144


@pytest.mark.parametrize(
    ("tokens", "level"),
    [(0, 1), (16_383, 1), (16_384, 2), (65_535, 2), (65_536, 3), (262_144, 4), (10**9, 4)],
)
def test_attained_levels(tokens: int, level: int) -> None:
    assert attained_level(SPEC, tokens) == level


@pytest.mark.parametrize(
    ("client", "cls", "subagent", "attained", "priority", "by"),
    [
        (0, "", False, None, 1, "session"),  # no session: as a fresh one
        (0, "main", False, 0, 1, "attained"),
        (0, "main", False, 70_000, 3, "attained"),
        (0, "", False, 300_000, 4, "attained"),
        (2, "", False, 300_000, 20, "attained"),  # the client's priority first: 2 x 8 + 4
        (0, "compaction", False, 300_000, 1, "compaction"),  # its own level
        (0, "auxiliary", False, 70_000, 1, "auxiliary"),
        (0, "", True, 0, 4, "subagent"),  # a subagent's session headers: level 4
        (0, "subagent", False, 0, 4, "subagent"),  # the declared class: the same
        (0, "compaction", True, 0, 1, "compaction"),  # a subagent compacting: compaction
        (1, "workflow", False, 20_000, 10, "attained"),  # a class without a level of its own
        (-1, "", False, 0, -7, "attained"),  # a negative client priority stays ahead
    ],
)
def test_fair_priority(
    client: int, cls: str, subagent: bool, attained: int | None, priority: int, by: str
) -> None:
    fair = fair_priority(SPEC, client, cls, subagent, attained)
    assert (fair.priority, fair.by) == (priority, by)


def test_a_subagent_label_never_raises_a_heavy_session() -> None:
    """Level 4 for subagents: a session past every boundary is already there; with a lower
    subagent level its attained level still stands."""
    spec = FairnessSpec(enabled=True, classes={"subagent": 2})
    fair = fair_priority(spec, 0, "subagent", True, 300_000)
    assert (fair.level, fair.by) == (4, "subagent-attained")
    assert fair_priority(spec, 0, "subagent", True, 0).level == 2


@pytest.mark.parametrize(
    "bad",
    [
        {"boundaries": [100, 100]},
        {"boundaries": [300, 100]},
        {"boundaries": [1, 2, 3, 4]},  # at most 4 levels
        {"boundaries": [0]},
        {"classes": {"main": 1}},
        {"classes": {"subagent": 8}},
        {"window_s": 0},
        {"window_s": 7200.0},
    ],
)
def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        FairnessSpec.model_validate(bad)


def _policy(fairness: dict[str, Any], priority_scheduling: bool = True) -> Any:
    doc = {
        "schema": 1,
        "backends": {
            "a": {
                "url": "http://127.0.0.1:1",
                "served_model_name": "m",
                "priority_scheduling": priority_scheduling,
            }
        },
        "routes": {"coder": {"models": ["coder"], "task": "generate", "variants": ["a"]}},
        "clients": [{"name": "agent", "key_sha256": "0" * 64, "priority": 1}],
        "fairness": fairness,
    }
    return compile_policy(PolicyDocument.model_validate(doc))


def _view(attained: int, request_class: str = "") -> RequestView:
    return RequestView(
        endpoint="chat",
        model="coder",
        client="agent",
        session=SessionView("s-1", engine="a", attained_tokens=attained),
        request_class=request_class,
    )


@pytest.mark.parametrize(
    ("fairness", "scheduling", "attained", "cls", "priority", "why"),
    [
        ({"enabled": True}, True, 70_000, "", 11, "attained 70,000 tokens in 600 s, < 262,144"),
        ({"enabled": True}, True, 0, "compaction", 9, "compaction: its own level"),
        ({"enabled": True}, False, 70_000, "", None, None),  # not a priority engine: nothing
        ({"enabled": False}, True, 70_000, "", 1, "fairness off: the client's priority 1"),
        ({}, True, 70_000, "", 1, "fairness off"),  # off unless the policy says so
    ],
)
def test_decide_sends_the_fair_priority_and_explains_it(
    fairness: dict[str, Any],
    scheduling: bool,
    attained: int,
    cls: str,
    priority: int | None,
    why: str | None,
) -> None:
    policy = _policy(fairness, scheduling)
    view = _view(attained, cls)
    assert decide(view, LiveState(), policy).priority == priority
    explained = decide(view, LiveState(), policy, explain=True)
    verdict = next((v for v in explained.verdicts if v.rule == "fairness"), None)
    if why is None:
        assert verdict is None
    else:
        assert verdict is not None and verdict.verdict == f"priority {priority}"
        assert why in verdict.detail, verdict.detail
    assert explained.verdicts[-1].verdict == "a"  # the choice stays the last verdict


def test_policy_explain_cli_shows_the_priority_and_why(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    doc = yaml.safe_load((ROOT / "policies" / "gb10.yaml").read_text())
    doc["fairness"] = {"enabled": True}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(doc))
    request = json.dumps({"model": "coder", "messages": [{"role": "user", "content": "hi"}]})
    argv = ["explain", str(path), "--request", request, "--session"]
    assert main([*argv, '{"attained_tokens": 70000}']) == 0
    out = capsys.readouterr().out
    assert "priority: 3" in out and "attained 70,000 tokens in 600 s" in out, out
    header = "x-claude-code-request-class:compaction"
    assert main([*argv, '{"attained_tokens": 70000}', "--header", header]) == 0
    out = capsys.readouterr().out
    assert "priority: 1" in out and "compaction: its own level" in out, out
    assert main([*argv, "{}", "--header", "no-colon"]) == 2
