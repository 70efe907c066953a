"""`python -m loadtests.bench.overhead`: the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import orjson

import loadtests.bench.overhead as package
from loadtests.bench.overhead import agents, baseline
from loadtests.bench.overhead.plan import log, make_plan, run_plan
from loadtests.bench.overhead.report import GOALS, describe, paced_cpu_ratio, render, summarize
from loadtests.bench.overhead.result import RoundResult
from loadtests.bench.overhead.rounds import Bench
from loadtests.bench.overhead.stack import TARGETS, Stack


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m loadtests.bench.overhead",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="shorter rounds, 2 repeats (~1 min)")
    ap.add_argument("--repeats", type=int, help="repeats of the alternating rounds")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")
    ap.add_argument("--no-nginx", action="store_true", help="skip the nginx comparison")
    ap.add_argument("--no-relay", action="store_true", help="skip the bare relay comparison")
    ap.add_argument(
        "--only",
        default="ttft1,paced16,sat,rss256,agents",
        help="comma-separated rounds to run (default: all)",
    )
    ap.add_argument("--prompt-bytes", type=int, default=4096, help="request body size, roughly")
    ap.add_argument(
        "--paced-tokens",
        type=int,
        default=48,
        help="chunks per paced response (48; an agent's ~460-token answer at ~4 "
        "tokens a step is ~115): the request's own CPU is spread over them",
    )
    ap.add_argument(
        "--otlp",
        action="store_true",
        help="the gateway exports OpenTelemetry (--otlp-endpoint) to a receiver on loopback",
    )
    baseline.add_arguments(ap)
    ap.add_argument(
        "--engine-without-request-id",
        action="store_true",
        help="the pacer does not echo x-request-id (vLLM without --enable-request-id-headers, "
        "which the deploy sets): the gateway then opens an engine connection per request",
    )
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    plan = make_plan(args.quick, args.repeats, args.paced_tokens)
    signal.signal(signal.SIGTERM, _interrupt)
    t_start = time.monotonic()
    try:
        with (
            baseline.checkout(args) as base_checkout,
            Stack(
                nginx=not args.no_nginx,
                relay=not args.no_relay,
                otlp=args.otlp,
                baseline=base_checkout,
                engine_echo=not args.engine_without_request_id,
            ) as stack,
        ):
            names = [n for n in TARGETS if n in stack.targets]
            log(
                f"pacer pid {stack.pacer.pid if stack.pacer else '?'}, gateway pid "
                f"{stack.gateway.pid if stack.gateway else '?'}"
                + (f", nginx pid {stack.nginx.pid}" if stack.nginx else "")
                + (
                    f", baseline pid {stack.baseline.pid} ({stack.baseline_module})"
                    if stack.baseline
                    else ""
                )
                + (f"; nginx skipped: {stack.nginx_skipped}" if stack.nginx_skipped else "")
            )
            log(describe(plan, args.prompt_bytes))

            async def go() -> tuple[list[RoundResult], list[RoundResult]]:
                bench = Bench(stack, prompt_bytes=args.prompt_bytes)
                try:
                    base = await run_plan(bench, plan, kinds=kinds)
                    agent_rounds = []
                    if "agents" in kinds:
                        log("agents' rounds: " + agents.DESCRIBE)
                        agent_rounds = await agents.run_agents(
                            bench, quick=args.quick, repeats=args.repeats or 3
                        )
                    return base, agent_rounds
                finally:
                    bench.close()

            results, agent_results = _run(go())
            for child in stack.children:
                if not child.alive():
                    log(f"{child.name} exited during the run:\n{''.join(child.output[-20:])}")
            if stack.otlp is not None:
                log(f"gateway telemetry: {''.join(stack.otlp.output[-1:]).strip()}")
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        return 130
    summary = summarize(results, names)
    print(
        f"\ngateway overhead on {os.cpu_count()} CPUs, {time.monotonic() - t_start:.0f} s "
        f"({'quick' if args.quick else 'full'} run); median (min–max, n = runs)"
    )
    print(describe(plan, args.prompt_bytes))
    if stack.nginx_skipped:
        print(f"nginx column skipped: {stack.nginx_skipped}")
    print(render(summary, names, results))
    if agent_results:
        print(f"\nagent-sized bodies: {agents.DESCRIBE}; median (min–max) over repeats")
        print(agents.render(agent_results, agents.scenarios(args.quick)))
    if args.json:
        doc = {
            "plan": describe(plan, args.prompt_bytes),
            "quick": args.quick,
            "targets": names,
            "goals": GOALS,
            "summary": {
                k: {
                    t: {"median": f.median, "values": f.values, "runs": f.runs}
                    for t, f in v.items()
                }
                for k, v in summary.items()
            },
            "cpu_paced_ratio_to_nginx": paced_cpu_ratio(results).values,
            "rounds": [r.__dict__ for r in results],
            "agents": {
                "describe": agents.DESCRIBE,
                "figures": agents.figures(agent_results, agents.scenarios(args.quick)),
                "rounds": [r.__dict__ for r in agent_results],
            },
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return 0
