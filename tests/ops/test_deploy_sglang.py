"""`specrouter deploy` for SGLang engines: the launch_server command line from the policy (DSpine's
published configuration as the named example), alone or beside vLLM, checked against the flag
table read from SGLang 0.5.23's own parser."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from policies.lint import KNOWN_METHODS, policy_warnings
from policies.schema import load_policy, validate_policy
from proxy.ops import deploy
from proxy.ops.deploy import llamacpp, sglang

ROOT = Path(__file__).resolve().parents[2]
DSPINE = ROOT / "deploy" / "examples" / "gb10-dspine-sglang.yaml"
GB10 = ROOT / "policies" / "gb10.yaml"


def _render(tmp_path: Path, doc: dict[str, Any]) -> tuple[Path, Path, dict[str, Any]]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(doc))
    out = tmp_path / "out"
    assert deploy.main(["render", str(policy), "--out", str(out)]) == 0
    return policy, out, yaml.safe_load((out / "compose.yaml").read_text())


def _beside_vllm() -> dict[str, Any]:
    """policies/gb10.yaml with the example's SGLang engine added as a second variant."""
    doc: dict[str, Any] = yaml.safe_load(GB10.read_text())
    dspine = yaml.safe_load(DSPINE.read_text())["backends"]["coder-dspine"]
    doc["backends"]["coder-dspine"] = dspine
    doc["routes"]["coder"]["variants"].append("coder-dspine")
    return doc


def test_the_dspine_example_renders_the_vendors_configuration(tmp_path: Path) -> None:
    _, out, compose = _render(tmp_path, yaml.safe_load(DSPINE.read_text()))
    service = compose["services"]["coder-dspine"]
    assert service["entrypoint"] == ["python3", "-m", "sglang.launch_server"]
    cmd = service["command"]
    assert {
        "--served-model-name=qwen3.8-27b",
        "--port=30000",
        "--max-running-requests=8",  # the vendor's concurrency
        "--enable-metrics",  # the gateway scrapes sglang:
        "--enable-priority-scheduling",  # the gateway's lower-first priorities
        "--schedule-low-priority-values-first",
        "--context-length=131072",
        "--speculative-algorithm=DSPARK",
        "--speculative-dspark-block-size=15",  # blocks of 16: 16 verified
        "--dtype=bfloat16",
        "--attention-backend=fa3",
    } <= set(cmd)
    assert any(a.startswith("--speculative-dspark-sps-table-path=${SPS_TABLE_") for a in cmd)
    assert any(a.startswith("--api-key=${SPECROUTER_CODER_KEY:?") for a in cmd)
    assert service["labels"][deploy.BACKEND_LABEL] == "coder-dspine"
    assert not [s for s in compose["services"] if s.startswith("coder-dflash")]  # instead of vLLM
    env = (out / "env.example").read_text()
    assert "SGLANG_IMAGE=" in env and "SPS_TABLE_CODER_DSPINE=" in env


def test_beside_vllm_both_run_and_the_check_round_trips(tmp_path: Path) -> None:
    policy, out, compose = _render(tmp_path, _beside_vllm())
    assert {"coder-dflash7", "coder-dspine"} <= set(compose["services"])
    doc = load_policy(policy)
    assert deploy.check_compose(doc, compose, compose_dir=out, policy=policy) == []
    cmd = compose["services"]["coder-dspine"]["command"]
    at = cmd.index("--max-running-requests=8")
    cmd[at : at + 1] = ["--max-running-requests", "16"]  # argparse's other spelling
    cmd.remove("--schedule-low-priority-values-first")
    cmd += ["--speculative-algorithm=MYSTERY", "--no-such-flag"]
    problems = deploy.check_compose(doc, compose, compose_dir=out, policy=policy)
    for said in (
        "--max-running-requests is '16' in the compose file, '8' in the policy",
        "--schedule-low-priority-values-first is None in the compose file",
        "has no --speculative-algorithm MYSTERY",
        "has no --no-such-flag",
    ):
        assert any(said in p for p in problems), (said, problems)


def test_table_holds_what_the_renderer_uses() -> None:
    assert {
        "--model-path",
        "--served-model-name",
        "--max-running-requests",
        "--mem-fraction-static",
        "--enable-metrics",
        "--enable-priority-scheduling",
        "--schedule-low-priority-values-first",
        "--api-key",
        "--context-length",
        "--tool-call-parser",
        "--reasoning-parser",
        "--speculative-algorithm",
        "--speculative-num-steps",
        "--speculative-eagle-topk",
        "--speculative-num-draft-tokens",
        "--speculative-dflash-block-size",
        "--speculative-dspark-block-size",
        "--speculative-dspark-sps-table-path",
        "--speculative-draft-model-path",
        "--dtype",
        "--attention-backend",
    } <= sglang.flags()
    assert {algorithm for algorithm, _, _ in sglang.METHODS.values()} <= sglang.algorithms()
    assert sglang.TABLE.read_text().startswith("# SGLang 0.5.23, ")


def test_a_method_without_a_rendering_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load(DSPINE.read_text())
    doc["backends"]["coder-dspine"]["speculative"]["method"] = "medusa"
    policy = tmp_path / "medusa.yaml"
    policy.write_text(yaml.safe_dump(doc))
    with pytest.raises(deploy.DeployError, match="medusa"):
        deploy.render(load_policy(policy), policy=policy, out_dir=tmp_path)


def test_the_policy_lint_knows_what_the_renderers_render() -> None:
    """`specrouter policy check` takes DSpine on an SGLang backend (and every method the SGLang
    and llama.cpp renderings know), and still flags one the backend's kind does not know."""
    assert KNOWN_METHODS["sglang"] == set(sglang.METHODS)
    assert KNOWN_METHODS["llamacpp"] == set(llamacpp.SPEC_TYPES)
    doc = load_policy(DSPINE)
    assert not [w for w in policy_warnings(doc) if "method" in w]
    as_vllm = yaml.safe_load(DSPINE.read_text())
    as_vllm["backends"]["coder-dspine"]["kind"] = "vllm"
    as_vllm["backends"]["coder-dspine"].pop("engine", None)
    warned = policy_warnings(validate_policy(as_vllm))
    assert any("'dspine' is not a method a vllm backend knows" in w for w in warned), warned
