"""docs/replay.md's sessions table: `specrouter replay --sim` over agents x temperatures.

    python -m loadtests.replay.table [--agents 1 2 4 8 16] [--duration 60] [--time-scale 0.1]

One run per cell, one after another (one simulator and one gateway at a time), measured after
--warmup; each cell's replay.json is kept under --out. Prints the Markdown table docs/replay.md shows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any


def _cell(agents: int, temperature: str, args: argparse.Namespace) -> dict[str, Any]:
    out = args.out / f"a{agents}-t{temperature}"
    cmd = [
        sys.executable,
        "-m",
        "proxy.cli",
        "replay",
        "--sim",
        "--agents",
        str(agents),
        "--temperature",
        temperature,
        "--duration",
        str(args.duration),
        "--time-scale",
        str(args.time_scale),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--out",
        str(out),
        "--progress-s",
        "30",
        *args.extra,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    print(done.stdout, file=sys.stderr, flush=True)
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
    data: dict[str, Any] = json.loads((out / "replay.json").read_text())
    return data


def _p(d: dict[str, Any], digits: int = 1) -> str:
    return "-" if not d.get("n") else f"{d['p50']:.{digits}f} / {d['p95']:.{digits}f}"


def row(agents: int, temperature: str, data: dict[str, Any]) -> str:
    o = data["overall"]
    hit = o.get("prefix_hit_rate")
    cpu = max(data["cpu_core_share"].values())
    ctx = o["context_tokens"]
    return (
        f"| {agents} | {temperature} | {o['turns']} | {_p(o['turn_s'])} | "
        f"{_p(o['ttft_s'])} | {_p(o['decode_tok_s'])} | "
        f"{'-' if hit is None else f'{hit:.1%}'} | {o.get('prefilled_per_turn') or 0:.0f} | "
        f"{o.get('preemptions', 0):.0f} | "
        f"{ctx.get('p50', 0) / 1000:.0f}K / {ctx.get('max', 0) / 1000:.0f}K | {cpu:.0%} |"
    )


HEADER = (
    "| agents | temperature | turns | turn s p50 / p95 | TTFT s p50 / p95 | "
    "decode tok/s p50 / p95 | prefix hits | prefilled / turn | preemptions | "
    "context p50 / max | busiest CPU |\n|---|---|---|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.replay.table")
    p.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--temperatures", nargs="+", default=["0.7", "unset"])
    p.add_argument("--duration", type=float, default=60.0, help="wall seconds per cell")
    p.add_argument("--time-scale", type=float, default=0.1)
    p.add_argument(
        "--warmup", type=float, default=5.0, help="wall seconds per cell left out of the figures"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("sessions-table"))
    p.add_argument("extra", nargs="*", help="more replay flags, after --")
    args = p.parse_args(argv)
    rows = [row(a, t, _cell(a, t, args)) for a in args.agents for t in args.temperatures]
    print(HEADER)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
