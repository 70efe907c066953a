"""The sweep's Markdown: one row per cell and configuration, then the verdicts per cell."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .verdict import METRICS

HEADER = (
    "| agents | temperature | configuration | turn s p50 | turn s p95 | TTFT s p95 | "
    "decode tok/s (all agents) | runs | errors | busiest CPU |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def fmt(s: Mapping[str, Any], digits: int = 1) -> str:
    if not s.get("n"):
        return "-"
    return f"{s['median']:.{digits}f} [{s['min']:.{digits}f}-{s['max']:.{digits}f}]"


def _verdict(v: Mapping[str, Any]) -> str:
    if v["winner"] is None:
        return str(v["reason"])
    ties = f" (not separable from {', '.join(v['ties'])})" if v["ties"] else ""
    return f"**{v['winner']}**{ties}"


def markdown(
    agg: Mapping[tuple[int, str], Mapping[str, Mapping[str, Any]]],
    verdicts: Mapping[tuple[int, str], Mapping[str, Any]],
    order: list[str],
    premises: str,
) -> str:
    rows = []
    for key in sorted(agg, key=lambda k: (k[0], k[1])):
        for name in order:
            f = agg[key].get(name)
            if f is None:
                continue
            t, p95, ttft, dec = (f[m] for m in METRICS)
            rows.append(
                f"| {key[0]} | {key[1]} | {name} | {fmt(t)} | {fmt(p95)} | {fmt(ttft, 2)} | "
                f"{fmt(dec)} | {f['ok_runs']}/{f['runs']} | {f['errors']} | {f['cpu_max']:.0%} |"
            )
    lines = [
        premises,
        "",
        "Each figure: median over runs [min-max over runs]; runs: runs with turns / runs; "
        "busiest CPU: the most loaded of client, gateway and simulator in any run (share of "
        "one core; above 80 % the figures are this machine's, not the GB10's).",
        "",
        HEADER,
        *rows,
        "",
        "| agents | temperature | wins on one GB10 | wins on two GB10s |",
        "|---|---|---|---|",
    ]
    for key in sorted(verdicts, key=lambda k: (k[0], k[1])):
        v = verdicts[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {_verdict(v['one_gb10'])} | {_verdict(v['two_gb10'])} |"
        )
    return "\n".join(lines) + "\n"
