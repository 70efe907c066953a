"""Session-aware admission in the policy document: the `admission.sessions` block as others
write it, its bounds, the lint warning, and `specrouter policy explain --residency`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from policies.cli import main
from policies.lint import policy_warnings
from policies.schema import PolicyError, parse_policy

BASE = """
schema: 1
backends:
  gb10: {url: "http://127.0.0.1:8001", served_model_name: m, kv_tokens: 100000,
         max_concurrency: 4}
  spare: {url: "http://10.0.0.2:8002", served_model_name: m}
  local: {url: "http://127.0.0.1:8003", served_model_name: m}
routes:
  coder: {models: [coder], task: generate, variants: [gb10, spare, local]}
"""
CONTRACT = """
admission:
  queue_timeout_s: 30          # exists
  sessions:                    # session-aware admission
    enabled: false             # default off
    max_wait_s: 600            # null = unlimited
    idle_s: 60                 # residency ends after this much idle
    fit_fraction: 0.9          # of the engine's KV tokens
"""


def test_the_contract_parses_with_its_defaults() -> None:
    doc = parse_policy(BASE + CONTRACT)
    s = doc.admission.sessions
    assert (s.enabled, s.max_wait_s, s.idle_s, s.fit_fraction) == (False, 600, 60, 0.9)
    assert parse_policy(BASE).admission.sessions == s  # the defaults are the contract's
    unlimited = parse_policy(BASE + CONTRACT.replace("max_wait_s: 600", "max_wait_s: null"))
    assert unlimited.admission.sessions.max_wait_s is None


@pytest.mark.parametrize(
    "bad",
    ["fit_fraction: 1.5", "fit_fraction: 0", "idle_s: 0", "max_wait_s: -1", "maxwait_s: 5"],
)
def test_bounds_and_misspellings_refused(bad: str) -> None:
    with pytest.raises(PolicyError):
        parse_policy(BASE + CONTRACT.replace("idle_s: 60 ", bad + " ", 1))


def test_on_without_kv_tokens_warns() -> None:
    on = CONTRACT.replace("enabled: false", "enabled: true")
    warnings = policy_warnings(parse_policy(BASE + on))
    assert len(warnings) == 1 and warnings[0].startswith("backends.spare: session-aware")
    assert policy_warnings(parse_policy(BASE + CONTRACT)) == []


def _explain(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    residency: dict[str, Any] | None,
    *extra: str,
) -> tuple[int, str]:
    path = tmp_path / "p.yaml"
    on = CONTRACT.replace("enabled: false", "enabled: true")
    path.write_text(BASE + on + "    turn_tokens: 1000\n    shared_prefix_tokens: 0\n")
    request = {"model": "coder", "user": "u1", "messages": [{"role": "user", "content": "hi"}]}
    args = ["explain", str(path), "--request", json.dumps(request), *extra]
    if residency is not None:
        args += ["--residency", json.dumps(residency)]
    code = main(args)
    out = capsys.readouterr()
    return code, out.out + out.err


def test_explain_says_why_a_turn_waits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    residency = {
        "residents": [{"key": "s-a", "prefix_tokens": 60_000, "idle_s": 5}],
        "waiting": [{"key": "s-b", "waited_s": 30}],
    }
    code, out = _explain(capsys, tmp_path, residency, "--session", '{"prefix_tokens": 30000}')
    line = next(x for x in out.splitlines() if x.strip().startswith("admission"))
    assert code == 0 and "wait" in line and "full:" in line
    assert "90,000 + 4 x 1,000 = 94,000 > 0.9 x 100,000 KV tokens = 90,000" in line
    assert "expected wait 120 s" in line  # one ahead, then it: 2 x idle_s
    code, out = _explain(capsys, tmp_path, {**residency, "waiting": []}, "--session",
                         '{"prefix_tokens": 20000}')  # fmt: skip
    assert "admission    admit          fits:" in out
    code, out = _explain(capsys, tmp_path, None)  # on: the engine as empty, admitted
    assert "admission    admit          fits:" in out
    code, out = _explain(capsys, tmp_path, {"resident": []})
    assert code == 2 and "--residency: unknown field(s) resident" in out


def test_explain_json_carries_the_verdict(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    residency = {"kv_tokens": 1000, "residents": [{"key": "s-a", "prefix_tokens": 900}]}
    code, out = _explain(capsys, tmp_path, residency, "--json")
    verdicts = json.loads(out)["decision"]["verdicts"]
    assert code == 0 and verdicts[-1]["rule"] == "admission"
    assert verdicts[-1]["verdict"] == "wait" and "x 1,000 KV tokens" in verdicts[-1]["detail"]
