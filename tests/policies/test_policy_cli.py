"""`specrouter policy check | explain | diff`, the warnings and the document diff."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.cli import main
from policies.diff import diff_documents
from policies.lint import policy_warnings
from policies.schema import load_policy, validate_policy

ROOT = Path(__file__).resolve().parents[2]
# The multi-variant policy: the warnings below change its rules and variants.
GB10 = ROOT / "loadtests" / "bench" / "sweep" / "gb10-three.yaml"


def gb10() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(GB10.read_text())
    return data


def write(tmp_path: Path, data: dict[str, Any], name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_shipped_policies_have_no_warnings() -> None:
    for path in sorted((ROOT / "policies").glob("*.yaml")):
        assert policy_warnings(load_policy(path)) == [], path


def test_the_shipped_single_engine_is_covered_by_its_repair() -> None:
    data: dict[str, Any] = yaml.safe_load((ROOT / "policies" / "gb10.yaml").read_text())
    assert data["routes"]["coder"]["variants"] == ["coder-dflash7"]
    del data["backends"]["coder-dflash7"]["repair"]
    assert any("no fallback and no repair" in w for w in policy_warnings(validate_policy(data)))


def _with(change: str, value: Any) -> dict[str, Any]:
    data = gb10()
    node: Any = data
    *parents, last = change.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value
    return data


SPEC = "backends.coder-dflash7.speculative"
RULES = "routes.coder.rules"

WARNINGS = [
    (
        "prob-without-block",
        f"{SPEC}.rejection_sample_method",
        "standard",
        "probabilistic draft without block verification",
    ),
    (
        "block-without-prob",
        f"{SPEC}.draft_sample_method",
        "greedy",
        "block verification with a greedy draft is a loss",
    ),
    ("unknown-method", f"{SPEC}.method", "telepathy", "'telepathy' is not a method"),
    (
        "single-speculative-variant",
        "routes.coder",
        {"models": ["coder"], "variants": ["coder-dflash7"]},
        "routes.coder: a single speculative variant, no fallback and no repair",
    ),
    (
        "min-p-default",
        "routes.coder.defaults",
        {"min_p": 0.1},
        "routes.coder.defaults: min_p/logit_bias",
    ),
    (
        "unreachable-rule",
        f"{RULES}.3",
        {"name": "late", "kind": "content", "classes": ["code"], "use": "coder-mtp3"},
        "rules[3] (rule 'late'): never evaluated, rule 'deep-block-when-quiet' always decides",
    ),
    (
        "canary-100",
        f"{RULES}.1",
        {"name": "all", "kind": "canary", "use": "coder-mtp3", "percent": 100},
        "rules[2] (rule 'deep-block-when-quiet'): never",
    ),
    (
        "load-above-capacity",
        f"{RULES}.2.scope",
        "variant",
        None,
    ),  # max_in_flight 2 < 16: no warning
    (
        "load-at-capacity",
        f"{RULES}.2",
        {
            "name": "cap",
            "kind": "load",
            "use": "coder-dflash7",
            "max_in_flight": 16,
            "otherwise": "coder-mtp3",
        },
        "max_in_flight: 16 is not below coder-dflash7's max_concurrency (16)",
    ),
    (
        "guard-plain-variant",
        "backends.coder-dflash7.speculative",
        None,
        "coder-dflash7 does not speculate; it has no acceptance",
    ),
    (
        "probe-shorter-than-window",
        f"{RULES}.1.probe_after_s",
        10,
        "probe_after_s: 10 s is shorter than the 30 s window",
    ),
]


@pytest.mark.parametrize(
    ("change", "value", "expected"), [w[1:] for w in WARNINGS], ids=[w[0] for w in WARNINGS]
)
def test_warnings(change: str, value: Any, expected: str | None) -> None:
    if change == f"{RULES}.3":
        data = gb10()
        data["routes"]["coder"]["rules"].append(value)
    else:
        data = _with(change, value)
    warnings = policy_warnings(validate_policy(data))
    if expected is None:
        assert warnings == []
    else:
        assert any(expected in w for w in warnings), warnings


def test_check(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "check", str(GB10))
    assert code == 0 and "valid (version" in out and "3 rules, 2 clients" in out
    risky = write(tmp_path, _with(f"{SPEC}.rejection_sample_method", "standard"))
    code, out, _ = run(capsys, "check", risky)
    assert code == 0 and "warning: backends.coder-dflash7.speculative" in out
    code, _, _ = run(capsys, "check", "--strict", risky)
    assert code == 1
    bad = write(tmp_path, _with("routes.coder.fallback", "nope"), "bad.yaml")
    code, out, _ = run(capsys, "check", str(GB10), bad)
    assert code == 1
    assert "bad.yaml: invalid\n  error: routes.coder.fallback: 'nope' is not one" in out


def test_explain_text(capsys: pytest.CaptureFixture[str]) -> None:
    request = json.dumps(
        {
            "model": "coder",
            "max_tokens": 10**6,
            "messages": [{"role": "user", "content": "fix src/a.py"}],
        }
    )
    state = json.dumps(
        {
            "backends": {"coder-dflash7": {"in_flight": 1, "acceptance": 2.1}},
            "guards": {"coder-dflash7": {"tripped": True}},
        }
    )
    code, out, _ = run(capsys, "explain", str(GB10), "--request", request, "--state", state)
    assert code == 0
    assert "backend: coder-mtp3  route: coder  reason: dflash-acceptance" in out
    assert "inject: temperature=0.7, max_tokens=32768" in out
    assert "dflash-acceptance      applied        coder-dflash7 tripped (acceptance 2.1)" in out


def test_explain_json_from_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "req.json").write_text('{"model": "coder", "temperature": 1.0}')
    code, out, _ = run(
        capsys,
        "explain",
        str(GB10),
        "--request",
        f"@{tmp_path / 'req.json'}",
        "--client",
        "bench",
        "--pin",
        "coder-mtp3",
        "--json",
    )
    data = json.loads(out)
    assert code == 0 and data["decision"]["backend"] == "coder-mtp3"
    assert data["decision"]["reason"] == "pinned" and data["decision"]["inject"] == {}
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO('{"model": "nope"}'))
    code, out, _ = run(capsys, "explain", str(GB10), "--request", "-")
    assert code == 0 and "rejected: 404 NotFoundError (unknown-model)" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--request", "{not json"], "--request:"),
        (["--request", "[1]"], "--request: expected a JSON object"),
        (["--request", "@/nonexistent.json"], "--request:"),
        (["--request", "{}", "--state", '{"backends": {"x": {"colour": 1}}}'], "--state:"),
    ],
)
def test_explain_usage_errors(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run(capsys, "explain", str(GB10), *argv)
    assert code == 2 and message in err


def test_explain_policy_without_clients(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    data = gb10()
    data["clients"] = []
    code, out, _ = run(capsys, "explain", write(tmp_path, data), "--request", '{"model":"coder"}')
    assert code == 0 and "client anonymous" in out


def test_diff(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, out, _ = run(capsys, "diff", str(GB10), str(GB10))
    assert (code, out) == (0, "no changes\n")
    data = gb10()
    rules = data["routes"]["coder"]["rules"]
    rules[0], rules[1] = rules[1], rules[0]
    rules[2]["max_in_flight"] = 3
    rules.append(
        {"name": "cool", "kind": "sampling", "temperature_below": 0.5, "use": "coder-mtp3"}
    )
    del data["backends"]["embed-small"]
    del data["routes"]["embed-small"]
    data["guard"] = {"window_s": 20}
    code, out, _ = run(capsys, "diff", str(GB10), write(tmp_path, data))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].startswith("- backends.embed-small: {'url': 'http://127.0.0.1:8012', ")
    assert lines[-1].startswith("- routes.embed-small: {'models': ['embedding-small'], ")
    assert lines[1:-1] == [
        "~ guard.window_s: 30.0 -> 20.0",
        "~ routes.coder.rules: order ['engine-health', 'dflash-acceptance', "
        "'deep-block-when-quiet'] -> ['dflash-acceptance', 'engine-health', "
        "'deep-block-when-quiet']",
        "+ routes.coder.rules[cool]: {'name': 'cool', 'kind': 'sampling', "
        "'temperature_at_least': None, 'temperature_below': 0.5, 'use': 'coder-mtp3'}",
        "~ routes.coder.rules[deep-block-when-quiet].max_in_flight: 2 -> 3",
    ]


def test_diff_lists_and_removed_named_items() -> None:
    a = validate_policy(gb10())
    data = copy.deepcopy(gb10())
    data["clients"] = data["clients"][:1]
    data["routes"]["coder"]["models"] = ["coder"]
    assert diff_documents(a, validate_policy(data)) == [
        "- clients[bench]: {'name': 'bench', 'key_sha256': "
        "'eab78ae98fcb02c66c09cc1e5713a40d838a33b10d8a94b0b7ea6ee6f99c88dc', 'defaults': {}, "
        "'allowed_variants': None, 'priority': 0, 'may_pin': True, 'max_concurrent': None, 'requests_per_minute': None}",
        "~ routes.coder.models: ['qwen3.8-27b', 'coder'] -> ['coder']",
    ]


def test_diff_unreadable(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "diff", str(GB10), str(tmp_path / "absent.yaml"))
    assert code == 2 and "absent.yaml" in err


def test_dispatch_from_specrouter(capsys: pytest.CaptureFixture[str]) -> None:
    from proxy.cli import main as specrouter

    assert specrouter(["policy", "check", str(GB10)]) == 0
    assert "valid" in capsys.readouterr().out


def test_bench_decide_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from loadtests.bench.decide import main as bench

    assert bench(["--calls", "20", "--rounds", "1", "--sessions", "100"]) == 0
    out = capsys.readouterr().out
    assert "20 rules, the 20th decides" in out and "-> deep (quiet)" in out
