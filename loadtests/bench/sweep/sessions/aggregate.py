"""The sessions sweep's records: the JSON-lines file they are appended to, and the figures over a
cell's repeats (median, min-max spread, run count), pure but for reading and appending."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from loadtests.bench.sweep.verdict import spread

from .configs import BY_NAME

METRICS = (
    "turns_per_hour",
    "turn_p50",
    "turn_p95",
    "turn_max",
    "longest_wait",
    "ttft_p50",
    "ttft_p95",
    "prefix_hit_rate",
    "prefilled_per_turn",
    "unfinished",
    "preemptions",
    "held",
    "turns_ended",
    "turns_resent",
    "resends",
    "watchdog_fires",
    "resend_prefill_tokens",
    "errors",
)
Key = tuple[str, int, str, int]  # configuration, agents, temperature, repeat


def read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def append(path: Path, record: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def key(rec: Mapping[str, Any]) -> Key:
    return (rec["config"], rec["agents"], rec["temperature"], rec["repeat"])


def done(records: Iterable[Mapping[str, Any]]) -> set[Key]:
    """Runs that need no rerun: those that produced turns (a failed start is tried again)."""
    return {key(r) for r in records if not r.get("failed")}


def cells(
    records: Sequence[Mapping[str, Any]],
) -> dict[tuple[int, str], dict[str, dict[str, Any]]]:
    """(agents, temperature) -> configuration -> metric -> spread over its runs, plus counts."""
    grouped: dict[tuple[int, str], dict[str, list[Mapping[str, Any]]]] = {}
    for rec in records:
        if rec.get("failed"):
            continue
        by = grouped.setdefault((rec["agents"], rec["temperature"]), {})
        by.setdefault(rec["config"], []).append(rec)
    out: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for cell, by in grouped.items():
        out[cell] = {
            name: {
                "runs": len(recs),
                "errors": sum(r.get("errors", 0) for r in recs),
                "cpu_max": max(r.get("cpu_max", 0.0) for r in recs),
                "scales": sorted({r["time_scale"] for r in recs}),
                "windows": sorted({r["window_s"] for r in recs if "window_s" in r}),
                **{m: spread(r.get(m) for r in recs) for m in METRICS},
            }
            for name, recs in by.items()
        }
    return out


def straight_of(name: str) -> str | None:
    """The straight run a configuration is paired with: the engine alone at the same budget
    (none for the straight runs themselves and the two-GB10 ones)."""
    config = BY_NAME.get(name)
    if config is None or config.policy is None or config.machines != 1:
        return None
    impatient = "impatient-" if name.startswith("impatient-") else ""  # the same agents
    return f"{impatient}straight-{config.kv_budget}"


def paired(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """(agents, temperature) -> configuration -> the spread of its turns per hour over its
    straight run's of the same repeat: the same seed, so the same sessions. The repeats'
    workloads differ (sessions of other sizes): a ratio within a repeat takes that out."""
    by: dict[tuple[int, str, int], dict[str, float]] = {}
    for rec in records:
        if not rec.get("failed") and rec.get("turns_per_hour"):
            cell = by.setdefault((rec["agents"], rec["temperature"], rec["repeat"]), {})
            cell[rec["config"]] = rec["turns_per_hour"]
    ratios: dict[tuple[int, str], dict[str, list[float]]] = {}
    for (agents, temp, _), runs in by.items():
        for config, value in runs.items():
            base = straight_of(config)
            if base is not None and base in runs:
                out = ratios.setdefault((agents, temp), {})
                out.setdefault(config, []).append(value / runs[base])
    return {
        cell: {config: spread(values) for config, values in configs.items()}
        for cell, configs in ratios.items()
    }
