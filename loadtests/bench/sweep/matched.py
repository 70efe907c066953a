"""Matched turns: each configuration's turn times against the engine straight's, turn by turn.

A repeat runs the same sessions in every configuration of a cell (one seed), so a turn is the
same work everywhere: the same agent, session and context. A short window cuts each run after a
different number of turns (a faster configuration finishes more of them), so percentiles over
each run's own turns compare different sets of turns. Here only the turns both runs finished
count, and the figure is their total time in the configuration over their total time straight
(a mean turn time ratio on identical work). Reads the per-run reports under runs/; pure otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .paired import REFERENCE, ratio_table
from .verdict import spread

TurnKey = tuple[Any, Any, Any]


def _by_key(turns: Iterable[Mapping[str, Any]]) -> dict[TurnKey, float]:
    return {
        (t["agent"], t["session"], t["context_tokens"]): float(t["turn_s"])
        for t in turns
        if not t.get("error") and t.get("turn_s") is not None
    }


def ratio(turns: Sequence[Mapping[str, Any]], ref: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Total time of the turns both finished, over the reference's; with the matched count."""
    mine, theirs = _by_key(turns), _by_key(ref)
    both = mine.keys() & theirs.keys()
    if not both:
        return {"ratio": None, "matched": 0}
    return {
        "ratio": sum(mine[k] for k in both) / sum(theirs[k] for k in both),
        "matched": len(both),
    }


def table(runs_dir: Path, reference: str = REFERENCE) -> dict[tuple[int, str], dict[str, Any]]:
    """(agents, temperature) -> configuration -> spread of the matched ratio over repeats."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for cell in sorted(runs_dir.glob("a*-t*")):
        agents_s, _, temp = cell.name[1:].partition("-t")
        reports = {p.stem: json.loads(p.read_text())["turns"] for p in cell.glob("*.json")}
        per_config: dict[str, list[dict[str, Any]]] = {}
        for stem, turns in reports.items():
            config, _, seed = stem.rpartition("-s")
            ref = reports.get(f"{reference}-s{seed}")
            if ref is None or config == reference:
                continue
            per_config.setdefault(config, []).append(ratio(turns, ref))
        out[(int(agents_s), temp)] = {
            name: {
                **spread(r["ratio"] for r in rs),
                "matched": sum(r["matched"] for r in rs),
            }
            for name, rs in per_config.items()
        }
    return out


def markdown(
    figures: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]],
    order: list[str],
    reference: str = REFERENCE,
) -> str:
    title = (
        f"Matched turns: the total time of the turns both runs finished, over `{reference}`'s, "
        "per repeat (same sessions); median [min-max] over repeats, and the matched turns in all; "
        "below 1.00 is faster than the engine straight."
    )
    return ratio_table(title, figures, order, reference, suffix=" ({matched})")
