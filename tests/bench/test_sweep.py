"""The sweep (loadtests/bench/sweep): its schedule, verdict and policies on tables, and its
smallest configuration end to end (one cell, one repeat, a 3 s window)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from loadtests.bench.sweep import __main__ as cli
from loadtests.bench.sweep import paired
from loadtests.bench.sweep.configs import (
    PAIR,
    PROFILES,
    THREE,
    all_configs,
    by_name,
    gateway_policy,
)
from loadtests.bench.sweep.policy import profile_for
from loadtests.bench.sweep.runner import Plan
from loadtests.bench.sweep.verdict import aggregate, decide, verdicts
from policies.schema import validate_policy


def fig(p50: tuple[float, ...], p95: tuple[float, ...]) -> dict[str, Any]:
    def s(xs: tuple[float, ...]) -> dict[str, Any]:
        return {"n": len(xs), "median": sorted(xs)[len(xs) // 2], "min": min(xs), "max": max(xs)}

    return {"turn_p50": s(p50), "turn_p95": s(p95)}


def test_a_clear_winner_and_one_within_spread() -> None:
    figures = {
        "a": fig((10, 11, 12), (30, 31, 32)),
        "b": fig((11.5, 13, 14), (31.5, 33, 34)),  # overlaps a's spread in both
        "c": fig((20, 21, 22), (50, 51, 52)),
    }
    v = decide(figures, ["a", "b", "c"])
    assert v["winner"] == "a" and v["ties"] == ["b"]
    assert decide(figures, ["b", "c"])["winner"] == "b"


def test_no_winner_when_p50_and_p95_disagree_beyond_spread() -> None:
    figures = {"fast": fig((10, 10.5, 11), (60, 61, 62)), "steady": fig((14, 15, 16), (40, 41, 42))}
    v = decide(figures, list(figures))
    assert v["winner"] is None
    assert "best turn p50 fast" in v["reason"] and "best turn p95 steady" in v["reason"]


def test_one_gb10_verdict_leaves_out_two_device_configurations() -> None:
    records = [
        {"config": name, "agents": 4, "temperature": "unset", "turns": 9, "errors": 0,
         "turn_p50": p50, "turn_p95": p50 * 2, "ttft_p95": 1.0, "decode_agg": 50.0}
        for name, p50 in (("one", 20.0), ("two", 10.0))
        for _ in range(3)
    ]  # fmt: skip
    v = verdicts(aggregate(records), {"one": 1, "two": 2})[(4, "unset")]
    assert v["one_gb10"]["winner"] == "one" and v["two_gb10"]["winner"] == "two"


def test_schedule_interleaves_configurations_per_repeat() -> None:
    configs = all_configs()
    plan = Plan(configs, [1, 2], [None, 0.7], repeats=3, duration_s=1, time_scale=0.1)
    sched = plan.schedule()
    assert len(sched) == 3 * 4 * len(configs)
    block = len(configs)
    firsts = set()
    for i in range(0, len(sched), block):
        chunk = sched[i : i + block]
        assert len({(r, a, t) for r, a, t, _ in chunk}) == 1  # one cell of one repeat
        assert sorted(c.name for *_, c in chunk) == sorted(c.name for c in configs)
        firsts.add(chunk[0][3].name)
    assert len(firsts) > 1  # the order rotates
    assert [r for r, *_ in sched] == sorted(r for r, *_ in sched)  # repeat after repeat


def test_every_configuration_policy_is_valid_on_the_simulators() -> None:
    for path in (THREE, PAIR):
        for name, spec in yaml.safe_load(path.read_text())["backends"].items():
            if name in PROFILES:
                assert profile_for(spec.get("speculative")) == PROFILES[name]
    for config in all_configs():
        if config.policy is None:
            continue
        urls = {b: f"http://127.0.0.1:{9000 + i}" for i, b in enumerate(config.engines)}
        doc = gateway_policy(config, urls, "0" * 64)
        validate_policy(doc)
        assert list(doc["backends"]) == list(config.engines)
    with pytest.raises(ValueError, match="unknown configuration"):
        by_name(["nope"])


def test_smallest_sweep_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sweep"
    rc = cli.main(
        ["--agents", "1", "--temperatures", "unset", "--repeats", "1", "--duration", "3",
         "--time-scale", "0.05", "--configs", "direct", "alone-dflash7", "--out", str(out)]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert "expected wall time" in err
    assert rc == 0, err[-2000:]
    doc = json.loads((out / "sweep.json").read_text())
    assert [(c["agents"], c["temperature"]) for c in doc["cells"]] == [(1, "unset")]
    cell = doc["cells"][0]
    assert set(cell["figures"]) == {"direct", "alone-dflash7"}
    for f in cell["figures"].values():
        assert f["ok_runs"] == f["runs"] == 1 and f["errors"] == 0
        assert f["turn_p50"]["n"] == 1 and f["turn_p50"]["median"] > 0
        assert f["decode_agg"]["median"] > 0
    v = cell["verdict"]["one_gb10"]
    assert v["winner"] in (None, "direct", "alone-dflash7") and v["reason"]
    assert {r["config"] for r in doc["runs"]} == {"direct", "alone-dflash7"}
    table = (out / "sweep.md").read_text()
    assert "| agents | temperature | configuration | turn s p50 |" in table
    assert "| 1 | unset | direct |" in table and "wins on one GB10" in table
    assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list((out / "runs" / "a1-tunset").glob("*.json"))


def _rec(config: str, repeat: int, p50: float, turns: int = 5) -> dict[str, object]:
    return {
        "config": config,
        "agents": 2,
        "temperature": "unset",
        "repeat": repeat,
        "turns": turns,
        "turn_p50": p50,
    }


def test_paired_ratios_take_out_the_repeat_to_repeat_spread() -> None:
    # seed 1's sessions are twice as slow for everyone: the ratio to direct stays 0.5
    records = [
        _rec("direct", 0, 10.0),
        _rec("fast", 0, 5.0),
        _rec("direct", 1, 20.0),
        _rec("fast", 1, 10.0),
        _rec("broken", 0, 3.0, turns=0),  # no turns: not a figure
        _rec("orphan", 2, 1.0),  # its repeat has no direct run: nothing to divide by
    ]
    table = paired.ratios(records)
    assert table[(2, "unset")]["fast"] == {"n": 2, "median": 0.5, "min": 0.5, "max": 0.5}
    assert table[(2, "unset")]["direct"]["median"] == 1.0
    assert "broken" not in table[(2, "unset")] and "orphan" not in table[(2, "unset")]
    text = paired.markdown(table, ["direct", "fast", "missing"])
    assert "| 2 | unset | 0.50 [0.50-0.50] | - |" in text


def test_rerender_rebuilds_the_tables_from_a_sweep_json() -> None:
    from loadtests.bench.sweep.rerender import render

    runs = [
        {**_rec(c, r, p50), "turn_p95": 2 * p50, "errors": 0}
        for c, r, p50 in (("direct", 0, 10.0), ("fast", 0, 5.0), ("direct", 1, 12.0))
    ]
    runs.append({**_rec("fast", 1, 6.0), "turn_p95": 12.0, "errors": 0})
    doc = {
        "premises": "P.",
        "configs": {"direct": {"machines": 1}, "fast": {"machines": 1}},
        "runs": runs,
    }
    text = render(doc)
    assert text.startswith("P.")
    assert "| 2 | unset | **fast** |" in text  # wins on one GB10
    assert text.count("| 2 | unset | 0.50 [0.50-0.50] |") == 2  # paired p50 and p95


def test_matched_turns_compare_only_the_turns_both_runs_finished(tmp_path: Path) -> None:
    from loadtests.bench.sweep import matched

    def turn(session: int, ctx: int, s: float) -> dict[str, object]:
        return {"agent": 0, "session": session, "context_tokens": ctx, "turn_s": s}

    cell = tmp_path / "a1-tunset"
    cell.mkdir()
    straight = [turn(0, 100, 10.0), turn(0, 200, 10.0)]
    # twice as fast on the same two turns, and one more turn the short window let it finish
    faster = [turn(0, 100, 5.0), turn(0, 200, 5.0), turn(0, 300, 1.0)]
    (cell / "direct-s0.json").write_text(json.dumps({"turns": straight}))
    (cell / "fast-s0.json").write_text(json.dumps({"turns": faster}))
    figures = matched.table(tmp_path)
    assert figures[(1, "unset")]["fast"]["median"] == 0.5
    assert figures[(1, "unset")]["fast"]["matched"] == 2
    assert "| 1 | unset | 0.50 [0.50-0.50] (2) |" in matched.markdown(figures, ["direct", "fast"])
