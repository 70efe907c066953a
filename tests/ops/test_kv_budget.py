"""The KV budget at the machine's limit: the memory model's arithmetic, what `deploy render` and
`deploy check` state, and one budget for the policy, the rendered files and the simulator."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml

from loadtests.sim.colocate import EngineSpec, kv_tokens
from loadtests.sim.profiles import BUILTIN_PROFILES
from policies.schema import load_policy, validate_policy
from policies.spec.deployment import KvBudgetName
from proxy.ops import deploy
from proxy.ops.deploy import memory
from proxy.ops.deploy.memory import GIB, CoderDemand, MemoryParams
from proxy.ops.deploy.plan import demand as plan_demand

ROOT = Path(__file__).resolve().parents[2]
GB10 = ROOT / "policies" / "gb10.yaml"
DEPLOYED = CoderDemand("coder", "dflash", 7, 262_144)  # block 7, probabilistic + block
MTP = CoderDemand("coder", "mtp", 3, 262_144)


# (params, embedders, demand) -> KV GiB, KV tokens, 100K contexts. KV = 119.21 GiB less the
# reserve (9.5), 4.77 GiB per embedder, the weights (24.92 with the drafter) and 4 of overhead;
# 22,595 tokens a GiB with block 7 (813,427 in 36 GiB), 28,191 with MTP.
@pytest.mark.parametrize(
    ("params", "embedders", "demand", "kv_gib", "tokens", "contexts"),
    [
        pytest.param(MemoryParams(), 2, DEPLOYED, 71.25, 1_609_965, 16, id="deployed"),
        pytest.param(MemoryParams(), 2, MTP, 74.20, 2_091_876, 20, id="mtp-no-drafter"),
        pytest.param(MemoryParams(), 0, DEPLOYED, 80.79, 1_825_449, 18, id="no-embedders"),
        pytest.param(MemoryParams(margin_gib=8.0), 2, DEPLOYED, 66.25, 1_496_989, 14, id="margin"),
        pytest.param(MemoryParams(reserved_gib=20.0), 2, DEPLOYED, 60.75, 1_372_715, 13, id="rsv"),
        pytest.param(MemoryParams(kv_budget_gib=36.0), 2, DEPLOYED, 36.0, 813_427, 8, id="doc"),
        pytest.param(
            MemoryParams(engine_overhead_gib=6.0), 2, DEPLOYED, 69.25, 1_564_774, 15, id="ovh"
        ),
    ],
)
def test_the_budget_arithmetic(
    params: MemoryParams,
    embedders: int,
    demand: CoderDemand,
    kv_gib: float,
    tokens: int,
    contexts: int,
) -> None:
    [engine] = memory.split([demand], embedders, params)
    assert engine.kv_gib == pytest.approx(kv_gib, abs=0.01)
    assert engine.kv_tokens == tokens
    assert engine.contexts(memory.LONG_CONTEXT) == contexts
    if params.kv_budget_gib is None:  # at the limit the machine is used up, nothing over
        used = params.reserve_gib + embedders * params.embed_share * params.machine_gib
        assert used + engine.total_gib == pytest.approx(params.machine_gib)


def test_the_reserve_is_itemised_with_its_margin() -> None:
    params = MemoryParams()
    items = dict(params.reserve_items())
    assert items["margin"] == 3.0 and items["Prometheus+Grafana"] == 1.0
    assert sum(items.values()) == params.reserve_gib == 9.5
    assert MemoryParams(reserved_gib=5.0).reserve_items() == [("reserved (the policy's)", 5.0)]
    # the KV geometry the tokens per GiB imply: ~47.5 KB a token for the deployed block 7
    [engine] = memory.split([DEPLOYED], 2)
    assert engine.kv_bytes_per_token == pytest.approx(36 * GIB / 813_427)


def test_named_budgets() -> None:
    assert set(typing.get_args(KvBudgetName)) == set(memory.KV_BUDGETS)
    assert memory.named_budget("machine") is None and memory.named_budget(None) is None
    assert memory.named_budget("documents") == 36.0 and memory.named_budget(20.5) == 20.5
    with pytest.raises(ValueError, match="one of machine, documents"):
        memory.named_budget("everything")
    assert memory.parse_budget("documents") == "documents" and memory.parse_budget("40") == 40.0
    for bad in ("0", "-3", "lots"):
        with pytest.raises(ValueError):
            memory.parse_budget(bad)


def test_the_shipped_budget_is_the_machine_limit_everywhere() -> None:
    """gb10.yaml names the machine's limit; what render writes, what the committed compose file
    carries and what the simulator's GB10 gives the deployed profile are one number."""
    doc = load_policy(GB10)
    assert doc.deployment.kv_budget_gib == "machine"
    plans, _ = deploy.engine_plans(doc)
    [plan] = [p for p in plans if p.memory is not None]
    assert plan.memory is not None
    [limit] = memory.split([plan_demand(plan)], len(plans) - 1)
    assert plan.memory.kv_bytes == limit.kv_bytes and plan.memory.kv_tokens == limit.kv_tokens
    assert plan.memory.contexts(memory.LONG_CONTEXT) == 16
    compose = (ROOT / "deploy" / "compose.yaml").read_text()
    assert f"KV_CACHE_BYTES_CODER_DFLASH7:-{limit.kv_bytes}}}" in compose
    alone = [EngineSpec("deep", 0, "dflash7-prob-block", None)]
    assert kv_tokens(alone, BUILTIN_PROFILES) == [plan.memory.kv_tokens]


def test_the_documents_budget_renders_36_gib() -> None:
    raw = yaml.safe_load(GB10.read_text())
    raw["deployment"]["kv_budget_gib"] = "documents"
    plans, _ = deploy.engine_plans(validate_policy(raw))
    [coder] = [p.memory for p in plans if p.memory is not None]
    assert coder is not None and coder.kv_bytes == 36 * GIB and coder.kv_tokens == 813_427
    raw["deployment"]["kv_budget_gib"] = "everything"
    with pytest.raises(Exception, match="kv_budget_gib"):
        validate_policy(raw)


def test_render_and_check_state_the_contexts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert deploy.main(["render", str(GB10), "--out", str(out)]) == 0
    rendered = capsys.readouterr().out
    assert deploy_lines(rendered)
    assert deploy.main(["check", str(GB10), str(out / "compose.yaml")]) == 0
    checked = capsys.readouterr().out
    assert deploy_lines(checked)
    # A compose file at the documents' 36 GiB is a difference, with both budgets stated.
    text = (out / "compose.yaml").read_text()
    old = f"KV_CACHE_BYTES_CODER_DFLASH7:-{72_962 * 1024**2}}}"
    assert old in text
    (out / "compose.yaml").write_text(
        text.replace(old, f"KV_CACHE_BYTES_CODER_DFLASH7:-{36 * GIB}}}")
    )
    assert deploy.main(["check", str(GB10), str(out / "compose.yaml")]) == 1
    diff = capsys.readouterr().out
    assert "KV budget is 36.0 GiB (813,427 tokens, 8 x 100K contexts)" in diff
    assert "the policy's 71.3 GiB (1,609,965 tokens, 16 x 100K)" in diff


def deploy_lines(text: str) -> bool:
    return (
        "margin 3" in text
        and "KV at the machine's limit" in text
        and "1,609,965 KV tokens of 47.5 KB" in text
        and "16 x 100K contexts" in text
    )
