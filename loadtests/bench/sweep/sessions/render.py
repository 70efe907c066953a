"""docs/sessions-sweep.md's generated part (the tables, between two markers) and the frontier PNG.

Every figure is the median over runs with its spread [min-max] and the run count; the tables
are rebuilt from the JSON-lines records alone, so a continued sweep re-renders all of them.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .aggregate import cells, paired
from .configs import BY_NAME, IMPATIENT

BEGIN, END = "<!-- sessions-sweep:begin -->", "<!-- sessions-sweep:end -->"


def _f(s: Mapping[str, Any], fmt: str, scale: float = 1.0) -> str:
    if not s.get("n"):
        return "-"
    med, lo, hi = (s[k] * scale for k in ("median", "min", "max"))
    if s["n"] == 1:
        return format(med, fmt)
    return f"{med:{fmt}} [{lo:{fmt}}-{hi:{fmt}}]"


HEAD = (
    "| configuration | runs | window s | turns / h | turn s p50 | turn s p95 | turn s max | longest wait s "
    "| TTFT s p50 | TTFT s p95 | prefix hits % | prefilled / turn | unfinished | held turns "
    "| turns / h over straight, same seed | busiest CPU |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def row(name: str, f: Mapping[str, Any], ratio: Mapping[str, Any] | None = None) -> str:
    return (
        f"| {name} | {f['runs']} | {'/'.join(f'{w:g}' for w in f.get('windows', []))} "
        f"| {_f(f['turns_per_hour'], '.0f')} | {_f(f['turn_p50'], '.0f')} "
        f"| {_f(f['turn_p95'], '.0f')} | {_f(f['turn_max'], '.0f')} "
        f"| {_f(f['longest_wait'], '.0f')} | {_f(f['ttft_p50'], '.1f')} "
        f"| {_f(f['ttft_p95'], '.0f')} | {_f(f['prefix_hit_rate'], '.1f', 100.0)} "
        f"| {_f(f['prefilled_per_turn'], ',.0f')} | {_f(f['unfinished'], '.0f')} "
        f"| {_f(f['held'], '.0f')} | {_f(ratio or {}, '.2f')} | {f['cpu_max']:.0%} |"
    )


IMPATIENT_HEAD = (
    "| configuration | runs | turns ended | turns resent | resends | watchdogs fired "
    "| turns failed | prefilled by the resent turns' last sends | longest wait s |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def impatient_table(agg: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]]) -> str:
    """What the impatient agents' watchdogs and resends did, per cell (in the window)."""
    parts = []
    for (agents, temp), by in sorted(agg.items()):
        names = [n for n in BY_NAME if n in IMPATIENT and n in by]
        if not names:
            continue
        rows = [
            f"| {n} | {by[n]['runs']} | {_f(by[n]['turns_ended'], '.0f')} "
            f"| {_f(by[n]['turns_resent'], '.0f')} | {_f(by[n]['resends'], '.0f')} "
            f"| {_f(by[n]['watchdog_fires'], '.0f')} | {_f(by[n]['errors'], '.0f')} "
            f"| {_f(by[n]['resend_prefill_tokens'], ',.0f')} | {_f(by[n]['longest_wait'], '.0f')} |"
            for n in names
        ]
        parts.append(
            f"**Impatient agents, {agents} agents, temperature {temp}** (median [min-max] per "
            f"run):\n\n{IMPATIENT_HEAD}\n" + "\n".join(rows)
        )
    return "\n\n".join(parts)


def tables(records: Sequence[Mapping[str, Any]]) -> str:
    agg = cells(records)
    ratios = paired(records)
    order = list(BY_NAME)
    parts: list[str] = []
    for (agents, temp), by in sorted(agg.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        names = sorted(by, key=order.index)
        scales = sorted({s for n in names for s in by[n]["scales"]})
        warm = sorted({r["warmup_s"] for r in records if r["agents"] == agents})
        parts.append(
            f"**{agents} agent{'s' if agents > 1 else ''}, temperature {temp}** (time scale "
            f"{', '.join(f'{s:g}' for s in scales)}; the window after a "
            f"{', '.join(f'{w:g}' for w in warm)} s warm-up):\n\n{HEAD}\n"
            + "\n".join(row(n, by[n], ratios.get((agents, temp), {}).get(n)) for n in names)
        )
    impatient = impatient_table(agg)
    return "\n\n".join(parts + ([impatient] if impatient else []))


def update(doc: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Replaces the generated part of `doc` (between the markers) with the tables."""
    text = doc.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    doc.write_text(f"{head}{BEGIN}\n{tables(records)}\n{END}{tail}")


def plot(records: Sequence[Mapping[str, Any]], path: Path, title: str) -> None:
    """Turns per hour against the longest wait, one panel per agent count (8+), one point per
    configuration at its medians, bars the spread over runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = cells(records)
    colour = {name: f"C{i % 10}" for i, name in enumerate(BY_NAME)}
    panels = sorted({a for a, _ in agg if a >= 8})
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.8), squeeze=False)
    for ax, agents in zip(axes[0], panels, strict=True):
        for (a, _temp), by in agg.items():
            if a != agents:
                continue
            for name, f in by.items():
                x, y = f["longest_wait"], f["turns_per_hour"]
                if not x.get("n") or not y.get("n"):
                    continue
                ax.errorbar(
                    x["median"],
                    y["median"],
                    xerr=[[x["median"] - x["min"]], [x["max"] - x["median"]]],
                    yerr=[[y["median"] - y["min"]], [y["max"] - y["median"]]],
                    fmt="o",
                    capsize=3,
                    color=colour.get(name, "k"),
                    label=f"{name} (n={f['runs']})",
                )
        ax.axvline(600, color="grey", linestyle=":", linewidth=1)
        ax.set(
            xlabel="longest wait for a first token, s (simulated)",
            ylabel="turns finished per simulated hour",
            title=f"{agents} agents",
        )
        ax.set_xlim(left=0)
        ax.set_ylim(bottom=0, top=ax.get_ylim()[1] * 1.15)
        ax.legend(fontsize=7)
    fig.suptitle(textwrap.fill(title, 150), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
