"""The decide set of the sweep (`python -m loadtests.bench.sweep [decide]`, see the package
docstring): its cells, its premises and what it writes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .configs import PARTIAL, all_configs, by_name
from .rerender import render
from .runner import Plan, run
from .verdict import aggregate, verdicts


@dataclass(frozen=True, slots=True)
class Mode:
    agents: tuple[int, ...]
    temperatures: tuple[str, ...]
    repeats: int
    duration_s: float
    time_scale: float


FULL = Mode((1, 2, 4, 8, 16), ("unset", "0.7"), 3, 60.0, 0.1)
# --quick keeps every configuration and cuts the rest: 2 of the 10 cells (2 and 8 agents, the
# client that sets nothing), 2 repeats instead of 3, 10 s windows at time scale 0.05 (200 s of
# simulated time, ~10 turns an agent) instead of 60 s at 0.1 (600 s).
QUICK = Mode((2, 8), ("unset",), 2, 10.0, 0.05)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.sweep decide", description=__doc__)
    p.add_argument("--quick", action="store_true", help="agents 2,8 x unset, 2 repeats, 10 s")
    p.add_argument("--agents", type=int, nargs="+", default=None, help="1 2 4 8 16")
    p.add_argument("--temperatures", nargs="+", default=None, help="unset 0.7")
    p.add_argument("--repeats", type=int, default=None, help="runs per cell and configuration (3)")
    p.add_argument("--duration", type=float, default=None, help="wall seconds per run (60)")
    p.add_argument("--time-scale", type=float, default=None, help="the simulator's (0.1)")
    p.add_argument(
        "--configs", nargs="+", default=None, help="; ".join(c.name for c in all_configs())
    )
    p.add_argument("--seed", type=int, default=0, help="repeat r runs seed + r")
    p.add_argument("--budget-s", type=float, default=None, help="start no run after this")
    p.add_argument(
        "--warmup", type=float, default=0.0, help="wall seconds of each run not measured (0)"
    )
    p.add_argument("--out", type=Path, default=Path(".state/sweep"))
    return p


def plan_from(args: argparse.Namespace) -> Plan:
    d = QUICK if args.quick else FULL
    temps: list[str] = args.temperatures or list(d.temperatures)
    return Plan(
        configs=by_name(args.configs),
        agents=args.agents or list(d.agents),
        temperatures=[None if t == "unset" else float(t) for t in temps],
        repeats=args.repeats or d.repeats,
        duration_s=args.duration or d.duration_s,
        time_scale=args.time_scale or d.time_scale,
        seed=args.seed,
        budget_s=args.budget_s,
        warmup_s=args.warmup,
    )


def premises(plan: Plan, wall_s: float) -> str:
    return (
        f"Simulated GB10s (loadtests/sim, device model loadtests/sim/device.py: co-located steps "
        f"serialise at @serial, overlap {PARTIAL:g} at @overlap{PARTIAL:g}); time scale "
        f"{plan.time_scale:g}, {plan.duration_s:g} s wall ({plan.duration_s / plan.time_scale:g} s "
        f"unscaled) per run, the first {plan.warmup_s:g} s wall not measured, {plan.repeats} repeat(s) per cell interleaved, seeds {plan.seed}.."
        f"{plan.seed + plan.repeats - 1}; `specrouter replay`'s default sessions; every duration "
        f"unscaled; sweep wall time {wall_s:.0f} s."
    )


def write(
    plan: Plan, records: list[dict[str, Any]], out: Path, wall_s: float, *, png: bool = True
) -> dict[str, Any]:
    agg = aggregate(records)
    machines = {c.name: c.machines for c in plan.configs}
    verdict = verdicts(agg, machines)
    text = premises(plan, wall_s)
    doc = {
        "premises": text,
        "configs": {c.name: {"what": c.what, "machines": c.machines} for c in plan.configs},
        "cells": [
            {"agents": a, "temperature": t, "figures": agg[(a, t)], "verdict": verdict[(a, t)]}
            for a, t in sorted(agg)
        ],
        "runs": records,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(doc, indent=1))
    # the tables (figures, verdicts, paired and matched ratios) are rebuilt from the JSON itself
    png_path = out / "sweep.png" if agg and png else None
    (out / "sweep.md").write_text(render(doc, png_path, out / "runs"))
    return doc


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        plan = plan_from(args)
    except ValueError as err:
        print(f"sweep: {err}", file=sys.stderr)
        return 2
    runs = len(plan.schedule())
    print(
        f"sweep: {len(plan.cells())} cells x {len(plan.configs)} configurations x "
        f"{plan.repeats} repeats = {runs} runs of {plan.duration_s:g} s at time scale "
        f"{plan.time_scale:g}; expected wall time {plan.expected_s() / 60:.0f} min "
        f"({plan.expected_s():.0f} s); results in {args.out}/",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.monotonic()

    def checkpoint(records: list[dict[str, Any]]) -> None:
        write(plan, records, args.out, time.monotonic() - t0, png=False)  # the PNG at the end

    records = run(plan, args.out, checkpoint=checkpoint)
    doc = write(plan, records, args.out, time.monotonic() - t0)
    print((args.out / "sweep.md").read_text())
    print(f"wrote {args.out}/sweep.json, sweep.md and sweep.png", file=sys.stderr)
    return 0 if doc["cells"] and all(r.get("turns", 0) > 0 for r in records) else 1
