"""Figures over a cell's repeats and the verdict per cell (pure: tested on tables).

A figure over runs is the median of the per-run values with its spread (min-max) and run count.
A configuration *wins* a cell when its turn time p50 and p95 are each <= every alternative's
within run spread: its median is <= the alternative's, or its own min is <= the alternative's
max (the two cannot be told apart by these runs). Candidates are tried in order of median turn
p50 (then p95); the first that passes wins. Runs that produced no turns do not count.

Verdicts are given per machine count: on one GB10 among the configurations that need one; on
two GB10s among all (what runs on one also runs on two).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

METRICS = ("turn_p50", "turn_p95", "ttft_p95", "decode_agg")
EXTRA = ("prefix_hit_rate", "preemptions")  # in the JSON, to read a result by
DECIDING = ("turn_p50", "turn_p95")  # lower is better


def spread(values: Iterable[float | None]) -> dict[str, Any]:
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median": statistics.median(xs), "min": xs[0], "max": xs[-1]}


def aggregate(records: Sequence[Mapping[str, Any]]) -> dict[tuple[int, str], dict[str, Any]]:
    """(agents, temperature) -> configuration -> metric -> spread, plus runs and errors."""
    cells: dict[tuple[int, str], dict[str, Any]] = {}
    for rec in records:
        cell = cells.setdefault((rec["agents"], rec["temperature"]), {})
        cell.setdefault(rec["config"], []).append(rec)
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for key, by_config in cells.items():
        out[key] = {}
        for name, recs in by_config.items():
            ok = [r for r in recs if r.get("turns", 0) > 0]
            out[key][name] = {
                "runs": len(recs),
                "ok_runs": len(ok),
                "errors": sum(r.get("errors", 0) for r in recs),
                # the busiest of client, gateway and simulator over the runs, share of a core
                "cpu_max": max((r.get("cpu_max", 0.0) for r in recs), default=0.0),
                **{m: spread(r.get(m) for r in ok) for m in (*METRICS, *EXTRA)},
            }
    return out


def _not_worse(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Figure `a` <= figure `b` within run spread."""
    return bool(a["median"] <= b["median"] or a["min"] <= b["max"])


def decide(figures: Mapping[str, Mapping[str, Any]], among: Iterable[str]) -> dict[str, Any]:
    """The winner among `among` in one cell, or None with the reason."""
    cands = [n for n in among if n in figures and all(figures[n][m]["n"] for m in DECIDING)]
    if not cands:
        return {"winner": None, "reason": "no configuration produced turns", "ties": []}
    cands.sort(key=lambda n: (figures[n]["turn_p50"]["median"], figures[n]["turn_p95"]["median"]))
    for name in cands:
        others = [o for o in cands if o != name]
        if all(_not_worse(figures[name][m], figures[o][m]) for o in others for m in DECIDING):
            ties = [
                o
                for o in others
                if all(_not_worse(figures[o][m], figures[name][m]) for m in DECIDING)
            ]
            return {
                "winner": name,
                "reason": "turn p50 and p95 <= every alternative's",
                "ties": ties,
            }
    best95 = min(cands, key=lambda n: figures[n]["turn_p95"]["median"])
    return {
        "winner": None,
        "reason": f"no clear winner: best turn p50 {cands[0]}, best turn p95 {best95}",
        "ties": [],
    }


def verdicts(
    agg: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]], machines: Mapping[str, int]
) -> dict[tuple[int, str], dict[str, Any]]:
    """Per cell: the verdict on one GB10 and on two."""
    one = [n for n, m in machines.items() if m == 1]
    return {
        key: {"one_gb10": decide(figs, one), "two_gb10": decide(figs, list(machines))}
        for key, figs in agg.items()
    }
