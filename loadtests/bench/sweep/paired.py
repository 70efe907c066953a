"""Paired comparison: each configuration's figure as a ratio of a reference's in the same repeat.

A repeat runs every configuration of a cell on the same sessions (the same seed), so most of the
run-to-run spread is the workload's (one seed's sessions are slower than another's), and it is
shared by every configuration of that repeat. Dividing by the reference's figure of the same
repeat takes it out: what remains is the configuration's own effect. Pure: tested on tables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .verdict import spread

REFERENCE = "direct"  # the deployed engine straight: what a client gets without the gateway


def ratios(
    records: Sequence[Mapping[str, Any]], metric: str = "turn_p50", reference: str = REFERENCE
) -> dict[tuple[int, str], dict[str, dict[str, Any]]]:
    """(agents, temperature) -> configuration -> spread of metric / reference's, per repeat."""
    ref: dict[tuple[int, str, int], float] = {}
    for r in records:
        if r["config"] == reference and r.get("turns", 0) > 0 and r.get(metric):
            ref[(r["agents"], r["temperature"], r["repeat"])] = float(r[metric])
    values: dict[tuple[int, str], dict[str, list[float]]] = {}
    for r in records:
        base = ref.get((r["agents"], r["temperature"], r["repeat"]))
        if base is None or r.get("turns", 0) == 0 or r.get(metric) is None:
            continue
        cell = values.setdefault((r["agents"], r["temperature"]), {})
        cell.setdefault(r["config"], []).append(float(r[metric]) / base)
    return {
        key: {name: spread(xs) for name, xs in by_config.items()}
        for key, by_config in values.items()
    }


def ratio_table(
    title: str,
    table: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]],
    order: list[str],
    reference: str = REFERENCE,
    suffix: str = "",
) -> str:
    """A ratio per cell and configuration (the reference left out), each median [min-max];
    `suffix` is formatted with the figure's fields (the matched turn count, say)."""
    shown = [n for n in order if n != reference]
    lines = [
        title,
        "",
        "| agents | temperature | " + " | ".join(shown) + " |",
        "|---|---|" + "---|" * len(shown),
    ]
    for key in sorted(table):
        cells = []
        for name in shown:
            s = table[key].get(name, {"n": 0})
            cells.append(
                f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]" + suffix.format(**s)
                if s.get("n")
                else "-"
            )
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def markdown(
    table: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]],
    order: list[str],
    metric: str = "turn_p50",
    reference: str = REFERENCE,
) -> str:
    title = (
        f"Paired by repeat: {metric} as a ratio of `{reference}`'s in the same repeat (same "
        "sessions), median [min-max] over repeats; below 1.00 is faster than the engine straight."
    )
    return ratio_table(title, table, order, reference)
