"""The sessions set of the sweep: run (or continue) the sessions sweep, or render it.

    python -m loadtests.bench.sweep sessions run      # every run not yet in the results, in order
    python -m loadtests.bench.sweep sessions run --stages a --budget-s 3000
    python -m loadtests.bench.sweep sessions render   # docs/sessions-sweep.md's tables and PNG
    python -m loadtests.bench.sweep sessions plan     # what is done and what is left

One replay at a time; each run's record is appended to the results file as soon as it ends, so
a sweep stopped anywhere continues with the next `run`.
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from pathlib import Path
from typing import Any

from loadtests.bench.sweep.runner import each

from .aggregate import append, done, read
from .configs import STAGES, Run, schedule
from .measure import run_one
from .render import plot, update

ROOT = Path(__file__).resolve().parents[4]
RESULTS = ROOT / "docs" / "sessions-sweep.jsonl"
DOC = ROOT / "docs" / "sessions-sweep.md"
PNG = ROOT / "docs" / "sessions-sweep.png"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.sweep sessions")
    p.add_argument("command", choices=("run", "render", "plan"))
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSON-lines records")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--stages", nargs="+", default=None, help=" ".join(s.name for s in STAGES))
    p.add_argument("--agents", type=int, nargs="+", default=None, help="only these agent counts")
    p.add_argument("--configs", nargs="+", default=None, help="only these configurations")
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--window", type=float, default=3600.0, help="simulated s measured")
    p.add_argument(
        "--window-small", type=float, default=1800.0, help="simulated s measured below 8 agents"
    )
    p.add_argument("--warmup", type=float, default=600.0, help="simulated s before the window")
    p.add_argument("--seed", type=int, default=0, help="repeat r runs seed + r")
    p.add_argument("--budget-s", type=float, default=None, help="start no run after this")
    p.add_argument("--max-runs", type=int, default=None)
    return p


def _commit() -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    return out.stdout.strip()


def todo(args: argparse.Namespace) -> list[Run]:
    only = None if args.stages is None else set(args.stages)
    finished = done(read(args.results))
    return [
        r
        for r in schedule(args.repeats, only=only)
        if r.key not in finished
        and (args.agents is None or r.agents in args.agents)
        and (args.configs is None or r.config in args.configs)
    ]


def run(args: argparse.Namespace) -> int:
    left = todo(args)
    if args.max_runs is not None:
        left = left[: args.max_runs]
    print(f"sessions sweep: {len(left)} runs to go -> {args.results}", file=sys.stderr)

    def window(r: Run) -> float:
        return float(args.window if r.agents >= 8 else args.window_small)

    started: dict[tuple[str, int, str, int], str] = {}  # each run's start, as its record says

    def measure(r: Run) -> dict[str, Any]:
        started[r.key] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        return run_one(
            r.config,
            r.agents,
            r.temperature,
            args.seed + r.repeat,
            time_scale=args.time_scale,
            window_s=window(r),
            warmup_s=args.warmup,
        )

    def record(i: int, r: Run, figures: dict[str, Any]) -> dict[str, Any]:
        return {
            "config": r.config,
            "agents": r.agents,
            "temperature": r.temperature,
            "repeat": r.repeat,
            "stage": r.stage,
            "seed": args.seed + r.repeat,
            "time_scale": args.time_scale,
            "window_s": window(r),
            "warmup_s": args.warmup,
            "commit": _commit(),
            "utc": started[r.key],
            **figures,
        }

    def line(r: Run, rec: dict[str, Any]) -> str:
        return (
            f"{r.stage} repeat {r.repeat} agents {r.agents} temp {r.temperature} {r.config}: "
            f"{rec.get('turns_per_hour', 0) or 0:.0f} turns/h, longest wait "
            f"{rec.get('longest_wait') or 0:.0f} s, hits {rec.get('prefix_hit_rate') or 0:.1%}"
            + (f" FAILED {rec['failed'][-200:]}" if "failed" in rec else "")
        )

    each(
        left,
        measure,
        record,
        name="sessions sweep",
        line=line,
        budget_s=args.budget_s,
        keep=lambda records: append(args.results, records[-1]),
    )
    return 0


def render(args: argparse.Namespace) -> int:
    records = read(args.results)
    update(DOC, records)
    plot(
        records,
        PNG,
        "specrouter sessions sweep: simulated GB10s (loadtests/sim; one GB10, two for the -2dev "
        "configurations), DFlash2 block 7 (pair-2dev: block 7 + block 5), agent sessions at the "
        "documents' context sizes (70K start, 131K compaction, 5 s think), temperature 0.7, time "
        "scale 0.05, 600 s warm-up then a 3,600 s window (-2dev: 1,800 s); median and min-max "
        "over runs (docs/sessions-sweep.md)",
    )
    print(f"rendered {len(records)} records into {DOC} and {PNG}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "plan":
        left = todo(args)
        for r in left:
            print(f"{r.stage:6} repeat {r.repeat} agents {r.agents:2} {r.temperature:5} {r.config}")
        print(f"{len(left)} runs left", file=sys.stderr)
        return 0
    return run(args) if args.command == "run" else render(args)
