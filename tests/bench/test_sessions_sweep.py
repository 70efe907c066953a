"""The sessions sweep's pure parts: the window's figures (unfinished turns counted), the schedule
(priority order, interleaved, each run once, resumable) and the configurations' policies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from loadtests.bench.sweep import __main__ as runner
from loadtests.bench.sweep.configs import gateway_policy
from loadtests.bench.sweep.sessions.aggregate import append, cells, done, paired, read
from loadtests.bench.sweep.sessions.configs import BY_NAME, STAGES, schedule
from loadtests.bench.sweep.sessions.measure import admission_figures, window_figures
from loadtests.bench.sweep.sessions.render import BEGIN, END, tables, update
from policies.schema import validate_policy
from proxy.observe.admission_metrics import AdmissionMetrics


def turn(start: float, took: float, ttft: float | None = 1.0, error: str | None = None) -> Any:
    return {"start_s": start, "turn_s": took, "ttft_s": ttft, "error": error}


def test_window_counts_unfinished_turns_and_their_wait() -> None:
    turns = [
        turn(50, 100),  # started in the warm-up, ended in the window: a turn of the hour
        turn(200, 100, ttft=10),
        turn(400, 50, ttft=2),
        turn(3500, 900, ttft=700),  # still running at the end: counted, not dropped
        turn(3700, 10),  # after the window
        turn(300, 5, ttft=None, error="HTTP 503"),
    ]
    f = window_figures(turns, 100.0, 3700.0)
    assert f["turns_ended"] == 3  # 150, 300, 450
    assert f["turns_per_hour"] == 3.0
    assert f["turns_started"] == 4
    assert f["unfinished"] == 1
    assert f["errors"] == 1
    assert f["longest_wait"] == 700
    assert f["turn_max"] == 900


def test_schedule_priority_interleaving_and_no_duplicates() -> None:
    runs = schedule(3)
    keys = [r.key for r in runs]
    assert len(keys) == len(set(keys))
    assert runs[0].stage == "a" and runs[0].agents == 16
    stages = [r.stage for r in runs]
    assert stages.index("b") > max(i for i, s in enumerate(stages) if s == "a")
    # within a cell the first configuration rotates between repeats
    firsts = {r.repeat: r.config for r in runs if r.stage == "a" and r.agents == 16}
    assert len(set(firsts.values())) > 1
    # stage b does not rerun stage a's straight runs at 16 agents
    assert sum(1 for r in runs if r.key == ("straight-machine", 16, "0.7", 0)) == 1
    assert {c for s in STAGES for c in s.configs} <= set(BY_NAME)


def test_resume_skips_what_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    rec = {"config": "straight-machine", "agents": 16, "temperature": "0.7", "repeat": 0}
    append(path, {**rec, "time_scale": 0.05, "turns_per_hour": 100.0, "cpu_max": 0.1})
    append(path, {**rec, "repeat": 1, "failed": "did not start"})
    assert done(read(path)) == {("straight-machine", 16, "0.7", 0)}
    agg = cells(read(path))
    assert agg[(16, "0.7")]["straight-machine"]["turns_per_hour"]["median"] == 100.0


def test_tables_replace_only_the_generated_part(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(f"intro\n{BEGIN}\nold\n{END}\noutro\n")
    base = {"agents": 8, "temperature": "0.7", "time_scale": 0.05, "cpu_max": 0.1}
    recs = [
        {**base, "config": c, "repeat": r, "warmup_s": 600, "window_s": 3600, "turn_p50": 10 + r}
        for c in ("straight-machine", "straight-documents")
        for r in range(3)
    ]
    update(doc, recs)
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{END}\noutro\n") and "old" not in text
    assert "| straight-documents | 3 | 3600 |" in text and "11 [10-12]" in text
    assert tables(recs).index("straight-documents") < tables(recs).index("straight-machine")


def test_the_two_gb10_configurations_are_valid_policies() -> None:
    for name in ("pair-2dev", "twins-2dev"):
        config = BY_NAME[name]
        urls = {b: f"http://127.0.0.1:{9000 + i}" for i, b in enumerate(config.engines)}
        doc = gateway_policy(config, urls, "0" * 64)
        validate_policy(doc)
        assert list(doc["backends"]) == list(config.engines)
    twins = gateway_policy(BY_NAME["twins-2dev"], {"coder-dflash7": "a", "coder-dflash7b": "b"}, "")
    spec = [twins["backends"][b]["speculative"] for b in ("coder-dflash7", "coder-dflash7b")]
    assert spec[0] == spec[1]


def test_the_admission_configurations_are_valid_policies() -> None:
    for name in (
        "admit-documents",
        "admit-machine",
        "admit-documents-w240",
        "admit-documents-wnone",
    ):
        config = BY_NAME[name]
        doc = gateway_policy(config, {"coder-dflash7": "http://127.0.0.1:9000"}, "0" * 64)
        validate_policy(doc)
        sessions = doc["admission"]["sessions"]
        assert sessions["enabled"] is True and sessions["fit_fraction"] == 0.9
        assert doc["backends"]["coder-dflash7"]["kv_tokens"] > 0
        # the gateway refuses a repair action no operator file defines (the bench has none)
        assert "repair" not in doc["backends"]["coder-dflash7"]
    assert BY_NAME["admit-documents-wnone"].edit is not None
    assert (
        gateway_policy(BY_NAME["admit-documents-wnone"], {"coder-dflash7": "u"}, "")["admission"][
            "sessions"
        ]["max_wait_s"]
        is None
    )
    kv = [
        gateway_policy(BY_NAME[n], {"coder-dflash7": "u"}, "")["backends"]["coder-dflash7"]
        for n in ("admit-documents", "admit-machine")
    ]
    assert kv[0]["kv_tokens"] < kv[1]["kv_tokens"]


def test_session_durations_run_on_the_simulators_clock() -> None:
    """The gateway reads the policy's waits on its own clock while the simulator runs 20x
    faster: the sweep states them in wall seconds (600 s of max_wait_s is 30 s at 0.05)."""
    urls = {"coder-dflash7": "http://127.0.0.1:9000"}
    for name, wait in (("admit-documents", 30.0), ("admit-documents-wnone", None)):
        doc = gateway_policy(BY_NAME[name], urls, "0" * 64, 0.05)
        validate_policy(doc)
        sessions = doc["admission"]["sessions"]
        assert sessions["max_wait_s"] == wait
        assert sessions["idle_s"] == 3.0
        assert sessions["stream_wait_s"] == 90.0  # the schema's 1,800 s, not stated in the edit
        assert doc["admission"]["queue_timeout_s"] == 1.5
    plain = gateway_policy(BY_NAME["admit-documents"], urls, "0" * 64)
    assert plain["admission"]["sessions"]["max_wait_s"] == 600


def test_the_control_configurations_run_the_gateway_with_admission_off() -> None:
    urls = {"coder-dflash7": "http://127.0.0.1:9000"}
    for budget in ("documents", "machine"):
        control = gateway_policy(BY_NAME[f"gateway-{budget}"], urls, "0" * 64)
        admit = gateway_policy(BY_NAME[f"admit-{budget}"], urls, "0" * 64)
        validate_policy(control)
        assert control["admission"]["sessions"]["enabled"] is False
        # everything else the admission run has: the same engine, KV tokens and fairness
        control["admission"]["sessions"]["enabled"] = True
        assert control == admit
    assert "ctl" in {run.stage for run in schedule(1)}


def test_what_admission_did_is_read_from_the_gateways_own_counters() -> None:
    registry = CollectorRegistry()
    metrics = AdmissionMetrics(registry)
    metrics.turns.labels("coder-dflash7", "admit", "fits").inc(40)
    metrics.turns.labels("coder-dflash7", "admit", "resident").inc(200)
    metrics.turns.labels("coder-dflash7", "wait", "full").inc(6)
    metrics.turns.labels("coder-dflash7", "wait", "queue").inc(2)
    metrics.waits.labels("coder-dflash7", "admitted").inc(7)
    metrics.waits.labels("coder-dflash7", "client_gone").inc(1)
    got = admission_figures(generate_latest(registry).decode())
    assert got == {
        "decided": 248,
        "held": 8,
        "held_by_reason": {"full": 6, "queue": 2},
        "wait_outcomes": {"admitted": 7, "client_gone": 1},
    }
    nothing = admission_figures(generate_latest(CollectorRegistry()).decode())
    assert nothing == {"decided": 0, "held": 0, "held_by_reason": {}, "wait_outcomes": {}}


def test_paired_ratios_divide_by_the_straight_run_of_the_same_seed() -> None:
    def rec(config: str, repeat: int, tph: float) -> dict[str, Any]:
        return {"config": config, "agents": 8, "temperature": "0.7", "repeat": repeat,
                "turns_per_hour": tph, "time_scale": 0.05, "warmup_s": 600.0}  # fmt: skip

    records = [
        rec("straight-machine", 0, 300.0),
        rec("admit-machine", 0, 360.0),  # 1.2 of its own seed's straight run
        rec("straight-machine", 1, 500.0),  # a seed of smaller sessions: every config faster
        rec("admit-machine", 1, 550.0),  # 1.1
        rec("admit-documents", 1, 400.0),  # no straight-documents of seed 1: no ratio
        rec("admit-machine", 2, 900.0),  # no straight run of seed 2: no ratio
        rec("twins-2dev", 0, 800.0),  # two GB10s: not paired
    ]
    got = paired(records)[(8, "0.7")]
    assert set(got) == {"admit-machine"}
    assert got["admit-machine"]["n"] == 2
    assert (got["admit-machine"]["min"], got["admit-machine"]["max"]) == pytest.approx((1.1, 1.2))
    assert "| 1.15 [1.10-1.20] |" in tables(records)


def test_the_runner_runs_the_sessions_set_briefly_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One short run (a simulator started and stopped by the runner; the gateway's start is the
    decide set's smoke test's), its record kept; `plan` then lists only the run not yet recorded."""
    results = tmp_path / "runs.jsonl"
    pick = ["--results", str(results), "--stages", "c-one", "--agents", "1"]
    pick += ["--configs", "straight-documents", "--repeats", "1"]
    short = ["--time-scale", "0.05", "--warmup", "0", "--window-small", "20", "--max-runs", "1"]
    assert runner.main(["sessions", "run", *pick, *short]) == 0
    (rec,) = read(results)
    assert "failed" not in rec, rec["failed"]
    assert (rec["config"], rec["agents"], rec["temperature"]) == ("straight-documents", 1, "0.7")
    assert rec["window_s"] == 20 and rec["turns_started"] >= 1 and rec["errors"] == 0
    capsys.readouterr()
    assert runner.main(["sessions", "plan", *pick]) == 0
    out, err = capsys.readouterr()
    assert "straight-documents" in out and "unset" in out and "0.7" not in out
    assert "1 runs left" in err
