"""Fairness on and off, interleaved: long and short agent sessions through the gateway to one
simulated GB10 engine with a small KV cache and vLLM's priority scheduling.

    python -m loadtests.bench.fairness --runs 3 --duration 60 --out /tmp/fairness

Each run starts a fresh simulator (`--scheduling-policy priority`, `--kv-budget` GiB) and a
gateway whose policy marks the engine `priority_scheduling` and turns `fairness` on or off, then
drives `--long` sessions (a large repository context) and `--short` ones (a small one) at once
with the replay's driver for `--duration` wall seconds. Reported per arm (on / off), over the
runs: turn time p50 / p95 of long and short sessions (unscaled seconds), turns finished, and
the engine's preemptions (`vllm:num_preemptions_total`, read from the simulator's /metrics).
Turns that started in the first `--warmup` simulated seconds (every session's first prefill,
when nobody has attained anything yet) are left out of the times.

The gateway's clock is wall time while the simulator's runs `--time-scale` times faster, so
the policy's fairness window is 600 s x the time scale of wall time (the simulated 10
minutes). Bounded: runs x 2 arms x (duration + a few seconds of start-up), loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from loadtests.replay.driver import Driver, TurnResult
from loadtests.replay.report import engine_counters
from loadtests.replay.workload import WorkloadParams
from proxy.observe.stats import quantile

SERVED = "qwen3.8-27b"
PROFILE = "dflash7-prob-block"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.fairness")
    p.add_argument("--runs", type=int, default=3, help="interleaved runs per arm")
    p.add_argument("--duration", type=float, default=60.0, help="wall seconds per run")
    p.add_argument("--time-scale", type=float, default=0.02)
    p.add_argument(
        "--warmup", type=float, default=600.0, help="simulated s: turns started before are left out"
    )
    p.add_argument("--kv-budget", default="12", help="the simulated engine's KV, GiB")
    p.add_argument("--long", type=int, default=4, help="long sessions at once")
    p.add_argument("--short", type=int, default=4, help="short sessions at once")
    p.add_argument("--long-context", type=int, default=50_000)
    p.add_argument("--short-context", type=int, default=2_000)
    p.add_argument("--out", type=Path, default=None, help="write fairness.json there")
    return p


def _params(args: argparse.Namespace, long: bool) -> WorkloadParams:
    if long:
        return WorkloadParams(
            agents=args.long,
            turns=40,
            initial_context=args.long_context,
            max_context=131_072,
            subagent_rate=0.0,
            seed=1,
        )
    return WorkloadParams(
        agents=args.short,
        turns=8,
        initial_context=args.short_context,
        new_tokens=1_000,
        max_context=40_000,
        subagent_rate=0.0,
        seed=2,
    )


def _policy(sim_url: str, fair: bool, scale: float) -> dict[str, Any]:
    doc = coder_policy({"deep": sim_url}, served=SERVED, defaults={})
    doc["backends"]["deep"]["priority_scheduling"] = True
    doc["fairness"] = {"enabled": fair, "window_s": 600.0 * scale}
    return doc


def _preemptions(url: str) -> float:
    return engine_counters(httpx.get(f"{url}/metrics", timeout=10).text)["preemptions"]


async def _drive(args: argparse.Namespace, gw: GatewayServer) -> tuple[list[TurnResult], ...]:
    import ssl

    verify = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    drivers = [
        Driver(
            _params(args, long),
            gw.base,
            time_scale=args.time_scale,
            duration_s=args.duration,
            verify=verify,
            api_key=CLIENT_KEY,
        )
        for long in (True, False)
    ]
    done = await asyncio.gather(*(d.run() for d in drivers))
    return tuple(done)


def run_once(args: argparse.Namespace, fair: bool) -> dict[str, Any]:
    extra = [
        "--scheduling-policy",
        "priority",
        "--kv-budget",
        str(args.kv_budget),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "qwen3_coder",
    ]
    with SimServer(
        PROFILE,
        served_model_name=SERVED,
        time_scale=args.time_scale,
        faults=False,
        extra_args=extra,
    ) as sim:
        with GatewayServer(_policy(sim.url, fair, args.time_scale)) as gw:
            before = _preemptions(sim.url)
            long, short = asyncio.run(_drive(args, gw))
            preempted = _preemptions(sim.url) - before
    out: dict[str, Any] = {"fairness": fair, "preemptions": preempted}
    for name, every in (("long", long), ("short", short)):
        turns = [t for t in every if t.start_s >= args.warmup]
        ok = [t.turn_s for t in turns if t.error is None]
        ttft = [t.ttft_s for t in turns if t.error is None and t.ttft_s is not None]
        out[name] = {
            "turns": len(ok),
            "errors": sum(1 for t in turns if t.error is not None),
            "turn_p50": quantile(ok, 0.5) if ok else None,
            "turn_p95": quantile(ok, 0.95) if ok else None,
            "ttft_p50": quantile(ttft, 0.5) if ttft else None,
        }
    return out


def summary(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| fairness | runs | short turn s p50 / p95 | long turn s p50 / p95 | short TTFT s p50 "
        "| turns short / long | preemptions per run |",
        "|---|---|---|---|---|---|---|",
    ]
    for fair in (True, False):
        arm = [r for r in runs if r["fairness"] is fair]
        if not arm:
            continue

        def span(group: str, key: str, arm: list[dict[str, Any]] = arm) -> str:
            values = [r[group][key] for r in arm if r[group][key] is not None]
            if not values:
                return "-"
            return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"

        turns = "/".join(
            f"{statistics.median([r[g]['turns'] for r in arm]):.0f}" for g in ("short", "long")
        )
        pre = ", ".join(f"{r['preemptions']:.0f}" for r in arm)
        lines.append(
            f"| {'on' if fair else 'off'} | {len(arm)} | {span('short', 'turn_p50')} / "
            f"{span('short', 'turn_p95')} | {span('long', 'turn_p50')} / "
            f"{span('long', 'turn_p95')} | {span('short', 'ttft_p50')} | {turns} | {pre} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    runs: list[dict[str, Any]] = []
    for i in range(args.runs):
        for fair in (True, False) if i % 2 == 0 else (False, True):  # interleaved, alternating
            t0 = time.monotonic()
            runs.append(run_once(args, fair))
            print(
                f"run {len(runs)}: fairness {'on' if fair else 'off'} "
                f"({time.monotonic() - t0:.0f} s): {json.dumps(runs[-1])}",
                file=sys.stderr,
                flush=True,
            )
    table = summary(runs)
    print(table)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fairness.json").write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": runs}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
