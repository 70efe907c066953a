"""What one policy decision costs: `python -m loadtests.bench.decide [--calls N] [--rounds R]`.

Times `policies.engine.decide` call by call (perf_counter_ns, the timer's own cost subtracted)
with a 20-rule policy, in the worst order for it: 18 selectors that do not match before the one
that does, plus a health rule and an acceptance guard. Also the shipped GB10 policy, and the
session path: the session table's lookup with 10,000 sessions plus the decision, whose
load rule says "move" and whose stickiness works out that the move does not pay. Prints the
median and p99 per scenario, each round's median, and the run counts. Address: under 20 us at the
median. A benchmark, not a test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from policies.compiled import CompiledPolicy
from policies.engine import decide
from policies.schema import load_policy, validate_policy
from policies.sessions import SessionId
from policies.types import BackendState, ContentSignals, GuardState, LiveState, RequestView
from proxy.backends.session_table import SessionTable

TARGET_US = 20.0


def twenty_rule_policy() -> CompiledPolicy:
    # 20 rules: a guard, 18 selectors that do not match the benchmark request, the load rule.
    rules: list[dict[str, Any]] = [
        {"name": "deep-guard", "kind": "acceptance_guard", "variant": "deep", "below": 2.8}
    ]
    for i in range(6):
        rules.append(
            {"name": f"client-{i}", "kind": "client", "clients": [f"c{i}"], "use": "plain"}
        )
        rules.append({"name": f"prose-{i}", "kind": "content", "classes": ["prose"], "use": "mtp"})
        rules.append(
            {
                "name": f"hot-{i}",
                "kind": "sampling",
                "temperature_at_least": 1.5 + i,
                "use": "plain",
            }
        )
    rules.append(
        {
            "name": "quiet",
            "kind": "load",
            "use": "deep",
            "max_in_flight": 2,
            "scope": "route",
            "count": "max",
            "otherwise": "mtp",
        }
    )
    assert len(rules) == 20
    backends: dict[str, Any] = {
        "deep": {
            "url": "http://127.0.0.1:1",
            "served_model_name": "m",
            "decode_tokens_per_s": 60.0,
            "speculative": {
                "method": "dflash",
                "num_speculative_tokens": 7,
                "draft_sample_method": "probabilistic",
                "rejection_sample_method": "block",
            },
        },
        "mtp": {
            "url": "http://127.0.0.1:2",
            "served_model_name": "m",
            "decode_tokens_per_s": 45.0,
            "speculative": {"method": "mtp", "num_speculative_tokens": 3},
        },
        "plain": {"url": "http://127.0.0.1:3", "served_model_name": "m"},
    }
    doc = {
        "schema": 1,
        "backends": backends,
        "routes": {
            "coder": {
                "models": ["coder"],
                "variants": ["deep", "mtp", "plain"],
                "fallback": "mtp",
                "defaults": {"temperature": 0.7},
                "defaults_by_class": {"code": {"temperature": 0.7}},
                "clamps": {"max_tokens": {"max": 32768}},
                "rules": rules,
            }
        },
        "clients": [{"name": f"c{i}", "key_sha256": f"{i:064x}"} for i in range(8)],
    }
    return CompiledPolicy(validate_policy(doc))


def _view(model: str, client: str) -> RequestView:
    return RequestView(
        endpoint="chat",
        model=model,
        client=client,
        stream=True,
        fields_set=frozenset({"model", "messages", "stream", "max_tokens", "tools"}),
        signals=ContentSignals(tools_declared=True, code_in_recent_messages=True),
        canary_bucket=0.42,
        now=1000.0,
        numeric_fields={"max_tokens": 4096},
    )


def _state(deep: str, mtp: str) -> LiveState:
    return LiveState(
        backends={
            deep: BackendState(in_flight=1, running=1, acceptance=3.9),
            mtp: BackendState(in_flight=0, running=0, acceptance=2.7),
        },
        guards={deep: GuardState()},
    )


SESSIONS = 10_000


class SessionCase:
    """What the gateway does per request of a known session: the table's row, the view with
    it, the decision. Called like `decide` so `measure` times it the same way."""

    def __init__(self, base: RequestView, sessions: int = SESSIONS) -> None:
        self.table = SessionTable(size=sessions)
        for n in range(sessions):
            sid = SessionId(f"s-{n:032x}", "header", "", False)
            self.table.placed(sid, "agent", "mtp", float(n))
            self.table.finished(
                sid.key,
                "mtp",
                float(n),
                prompt_tokens=100_000,
                completion_tokens=800,
                cached_tokens=99_000,
                decode_s=10.0,
            )
        self.sid = SessionId(f"s-{sessions // 2:032x}", "header", "", False)
        self.base = base

    def __call__(self, view: RequestView, state: LiveState, policy: CompiledPolicy) -> Any:
        session = self.table.view(self.sid, view.now)
        return decide(replace(view, session=session), state, policy)


def _timer_cost_ns(samples: int = 100_000) -> float:
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    return float(statistics.median(deltas))


def measure(
    view: RequestView,
    state: LiveState,
    policy: CompiledPolicy,
    calls: int,
    rounds: int,
    call: Any = decide,
) -> tuple[list[float], list[float]]:
    """Per-call times in microseconds (all rounds), and each round's median."""
    clock = time.perf_counter_ns
    # Both scaled down for a smoke run's few calls only: a full run's are the same.
    overhead = _timer_cost_ns(min(100_000, calls * 5))
    for _ in range(min(2_000, calls * 10)):  # warm caches and the interpreter's specialisations
        call(view, state, policy)
    every: list[float] = []
    medians: list[float] = []
    gc.disable()  # a collection inside one call is the collector's cost, not the decision's
    try:
        for _ in range(rounds):
            times = []
            for _ in range(calls):
                t0 = clock()
                call(view, state, policy)
                times.append((clock() - t0 - overhead) / 1000.0)
            medians.append(statistics.median(times))
            every += times
            gc.collect()
    finally:
        gc.enable()
    return every, medians


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sessions", type=int, default=SESSIONS, help="in the session table")
    args = parser.parse_args(argv)

    gb10 = CompiledPolicy(
        load_policy(Path(__file__).resolve().parent / "sweep" / "gb10-three.yaml")
    )
    twenty = twenty_rule_policy()
    agent = _view("coder", "agent")
    scenarios: list[tuple[str, RequestView, LiveState, CompiledPolicy, Any]] = [
        ("20 rules, the 20th decides", agent, _state("deep", "mtp"), twenty, decide),
        (
            "gb10-three.yaml (3 rules)",
            _view("qwen3.8-27b", "coding-agent"),
            _state("coder-dflash7", "coder-mtp3"),
            gb10,
            decide,
        ),
        (
            f"20 rules + session of {args.sessions}",
            agent,
            _state("deep", "mtp"),
            twenty,
            SessionCase(agent, args.sessions),
        ),
    ]
    print(f"python {sys.version.split()[0]}, {args.rounds} rounds x {args.calls} calls")
    print(f"{'scenario':<34} {'median us':>10} {'p99 us':>8}  round medians (us)")
    worst_median = 0.0
    for name, view, state, policy, call in scenarios:
        decision = call(view, state, policy)
        assert decision.backend is not None, decision
        every, medians = measure(view, state, policy, args.calls, args.rounds, call)
        every.sort()
        median = statistics.median(every)
        p99 = every[int(len(every) * 0.99)]
        worst_median = max(worst_median, median)
        spread = ", ".join(f"{m:.2f}" for m in medians)
        print(
            f"{name:<34} {median:>10.2f} {p99:>8.2f}  {spread}   -> {decision.backend} "
            f"({decision.reason})"
        )
    verdict = "under" if worst_median < TARGET_US else "OVER"
    print(f"target: median under {TARGET_US:g} us -> {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
