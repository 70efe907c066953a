"""The one loop every set of the sweep runs (`each`), and the interleaved set's schedule: every
repeat runs every cell, and within a cell every configuration once, in an order rotated per
repeat and cell, so no configuration always runs first or last.

Each run is `specrouter replay` (loadtests.replay.cli.replay) against a freshly started
configuration; the repeat's seed is the same for every configuration of a cell (the same
sessions, the same content), different between repeats. Results are written after every run,
so a sweep stopped early (Ctrl-C, --budget-s) keeps what it measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from loadtests.replay.cli import replay
from loadtests.replay.workload import WorkloadParams

from .configs import Config
from .launch import started

# Seconds to start and stop a configuration on this machine (measured, 2 cores): processes per
# device plus the gateway; used only for the expected wall time printed before the sweep.
START_S = {"direct": 1.0, "gateway": 2.5, "colocated": 4.0}
TAIL_S = 1.5  # turns in flight at the deadline finish; metrics are read

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Plan:
    configs: list[Config]
    agents: list[int]
    temperatures: list[float | None]
    repeats: int
    duration_s: float  # wall seconds per run
    time_scale: float
    seed: int = 0
    budget_s: float | None = None  # stop starting runs after this many wall seconds
    warmup_s: float = 0.0  # wall seconds of each run not measured

    def cells(self) -> list[tuple[int, float | None]]:
        return [(a, t) for a in self.agents for t in self.temperatures]

    def schedule(self) -> list[tuple[int, int, float | None, Config]]:
        """(repeat, agents, temperature, configuration), interleaved per repeat."""
        out = []
        n = len(self.configs)
        for r in range(self.repeats):
            for c, (agents, temp) in enumerate(self.cells()):
                shift = (r + c) % n
                for config in self.configs[shift:] + self.configs[:shift]:
                    out.append((r, agents, temp, config))
        return out

    def expected_s(self) -> float:
        def start(c: Config) -> float:
            if c.policy is None:
                return START_S["direct"]
            return START_S["colocated" if c.colocated or len(c.devices) > 1 else "gateway"]

        total = sum(self.duration_s + TAIL_S + start(c) for _, _, _, c in self.schedule())
        return total if self.budget_s is None else min(total, self.budget_s)


def temp_label(t: float | None) -> str:
    return "unset" if t is None else f"{t:g}"


def summarize_run(report: dict[str, Any], scale: float) -> dict[str, Any]:
    """The figures the sweep compares, from one replay report."""
    o = report["overall"]
    wall_unscaled = report["wall_s"] / scale
    return {
        "turns": o["turns"],
        "errors": o["errors"],
        "turn_p50": o["turn_s"].get("p50"),
        "turn_p95": o["turn_s"].get("p95"),
        "ttft_p95": o["ttft_s"].get("p95"),
        # every generated token of the run over its unscaled wall time: what the device delivered
        "decode_agg": o["generated_tokens"] / wall_unscaled if wall_unscaled > 0 else None,
        "prefix_hit_rate": o.get("prefix_hit_rate"),
        "preemptions": o.get("preemptions"),
        "cpu_max": max(report["cpu_core_share"].values(), default=0.0),
        "warnings": report["warnings"],
        "error_samples": report["error_samples"],
    }


def run_one(
    config: Config, agents: int, temp: float | None, seed: int, plan: Plan, out: Path | None
) -> dict[str, Any]:
    params = WorkloadParams(agents=agents, temperatures=(temp,), seed=seed)
    # every configuration starts cold the same way (the shared prefix uncached); --warmup leaves
    # that start out of the figures (turns started before it, and the engines' counters)
    args = argparse.Namespace(
        duration=plan.duration_s, progress_s=max(30.0, plan.duration_s), warmup=plan.warmup_s
    )
    with started(config, time_scale=plan.time_scale, seed=seed) as (target, kv, _):
        report = replay(args, params, target, plan.time_scale)
    if out is not None:
        path = out / "runs" / f"a{agents}-t{temp_label(temp)}" / f"{config.name}-s{seed}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report))
    return {**summarize_run(report, plan.time_scale), "kv_tokens": kv}


def each(
    items: Sequence[T],
    measure: Callable[[T], dict[str, Any]],
    record: Callable[[int, T, dict[str, Any]], dict[str, Any]],
    *,
    name: str,
    line: Callable[[T, dict[str, Any]], str],
    budget_s: float | None = None,
    keep: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Every set's loop: one run at a time, each `measure`d, `record`ed (the set's fields around
    the figures) and handed to `keep` as soon as it ends, so a sweep stopped anywhere (Ctrl-C,
    `budget_s`: no run starts after that many wall seconds) keeps what it measured."""
    records: list[dict[str, Any]] = []
    t0 = time.monotonic()
    for i, item in enumerate(items):
        if budget_s is not None and time.monotonic() - t0 > budget_s:
            print(f"{name}: budget of {budget_s:g} s spent after {i} runs", file=sys.stderr)
            break
        try:
            figures = measure(item)
        except (RuntimeError, OSError, httpx.HTTPError) as err:
            # a process that did not start, an engine's /metrics unreadable, a read that timed
            # out: recorded, and the sweep goes on (one run must not cost hours of others)
            figures = {"failed": str(err)[-500:]}
        records.append(record(i, item, figures))
        print(
            f"{name}: [{i + 1}/{len(items)}] {time.monotonic() - t0:6.0f} s  "
            + line(item, records[-1]),
            file=sys.stderr,
            flush=True,
        )
        if keep is not None:
            keep(records)
    return records


def run(
    plan: Plan,
    out: Path | None,
    *,
    checkpoint: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """The interleaved sweep's schedule (decide.py), run by `each`."""
    Step = tuple[int, int, float | None, Config]

    def measure(step: Step) -> dict[str, Any]:
        r, agents, temp, config = step
        return run_one(config, agents, temp, plan.seed + r, plan, out)

    def record(i: int, step: Step, figures: dict[str, Any]) -> dict[str, Any]:
        r, agents, temp, config = step
        if "failed" in figures:
            figures = {"turns": 0, "errors": 0, **figures}
        return {
            "config": config.name,
            "agents": agents,
            "temperature": temp_label(temp),
            "repeat": r,
            "seed": plan.seed + r,
            "order": i,
            **figures,
        }

    def line(step: Step, rec: dict[str, Any]) -> str:
        r, agents, temp, config = step
        p50 = rec.get("turn_p50")
        return (
            f"repeat {r} agents {agents} temp {temp_label(temp)} {config.name}: "
            f"{rec['turns']} turns, turn p50 {'-' if p50 is None else f'{p50:.1f}'} s"
        )

    return each(
        plan.schedule(),
        measure,
        record,
        name="sweep",
        line=line,
        budget_s=plan.budget_s,
        keep=checkpoint,
    )
