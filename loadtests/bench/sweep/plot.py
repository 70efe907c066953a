"""The sweep's PNG: turn time p50 and p95 against agents, one line per configuration, one
column per temperature; error bars are the spread over runs (matplotlib, as the replay's)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def plot(
    agg: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]],
    order: list[str],
    path: Path,
    title: str,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({t for _, t in agg})
    fig, axes = plt.subplots(2, len(temps), figsize=(6.5 * len(temps), 8), squeeze=False)
    for col, temp in enumerate(temps):
        for row, metric in enumerate(("turn_p50", "turn_p95")):
            ax = axes[row][col]
            for name in order:
                pts = sorted(
                    (a, figs[name][metric])
                    for (a, t), figs in agg.items()
                    if t == temp and name in figs and figs[name][metric].get("n")
                )
                if not pts:
                    continue
                xs = [a for a, _ in pts]
                mid = [s["median"] for _, s in pts]
                lo = [s["median"] - s["min"] for _, s in pts]
                hi = [s["max"] - s["median"] for _, s in pts]
                style = (
                    "--" if "2dev" in name else ("-" if "@" in name or name == "direct" else ":")
                )
                ax.errorbar(xs, mid, yerr=[lo, hi], label=name, capsize=3, linestyle=style)
            ax.set_xscale("log", base=2)
            ax.set(
                xlabel="agents",
                ylabel=f"turn time {metric[-3:]}, s (unscaled)",
                title=f"temperature {temp}: turn time {metric[-3:]}",
            )
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
