"""`specrouter replay`: coding-agent sessions against a gateway, engines, or a simulated GB10.

    specrouter replay --sim --agents 2 --duration 60            # one-device simulated GB10
    specrouter replay --target https://127.0.0.1:8443 --ca ca.pem --api-key KEY --time-scale 0.05

`--sim` starts one `specrouter sim` process for one device (by default the deployed variant
alone with the whole machine: DFlash2 block 7, probabilistic + block) and, unless `--direct`,
the gateway in front of it over TLS with no temperature default (so "unset" stays unset). The
run is bounded by `--duration` wall seconds; durations are reported unscaled (wall seconds /
`--time-scale`). The simulated engine's KV is `--kv-budget`: `machine` (the default, what
`deploy render` gives policies/gb10.yaml's engine), `documents` (the source documents' 36 GiB)
or a number of GiB; the report states the tokens it holds. Prefix-cache hits and preemptions come from the engines' /metrics (`--sim`
knows them; otherwise pass `--engine-metrics URL`). A warning says when the client, the
gateway or the simulator used more than 80 % of a core: then the figures are this machine's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import ssl
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness.procfs import cpu_seconds, self_cpu
from proxy.helptext import DefaultsHelp
from proxy.ops.deploy.memory import parse_budget

from . import report
from .driver import Driver, TurnResult
from .workload import APIS, WorkloadParams


def _temperatures(text: str) -> tuple[float | None, ...]:
    return tuple(None if t.strip() == "unset" else float(t) for t in text.split(","))


def _mix(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.partition("=")
        if name not in APIS:
            raise argparse.ArgumentTypeError(f"unknown API {name!r} (one of {', '.join(APIS)})")
        out[name] = float(weight or 1)
    return out


def build_parser() -> argparse.ArgumentParser:
    d = WorkloadParams()
    p = argparse.ArgumentParser(
        prog="specrouter replay", description=__doc__.split("\n")[0], formatter_class=DefaultsHelp
    )
    where = p.add_argument_group("where")
    where.add_argument("--target", help="gateway or engine base URL")
    where.add_argument("--ca", help="CA certificate to verify the target's TLS certificate")
    where.add_argument("--insecure", action="store_true", help="do not verify TLS")
    where.add_argument("--api-key", default=None, help="the target's client key")
    where.add_argument(
        "--engine-metrics",
        action="append",
        default=[],
        metavar="URL",
        help="an engine's base URL whose /metrics to read (repeat)",
    )
    where.add_argument("--sim", action="store_true", help="start a one-device simulated GB10")
    where.add_argument("--direct", action="store_true", help="--sim without the gateway")
    where.add_argument(
        "--sim-engine",
        action="append",
        default=[],
        metavar="NAME:PROFILE[:SHARE]",
        help="an engine of the simulated device (default deep:dflash7-prob-block)",
    )
    where.add_argument("--overlap", type=float, default=0.0, help="the device model's overlap")
    where.add_argument(
        "--kv-budget",
        type=parse_budget,
        default="machine",
        metavar="machine|documents|GIB",
        help="--sim: the KV of an engine without a share (default machine: the deployed budget; "
        "documents: the source documents' 36 GiB)",
    )
    where.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="the simulator's time scale (--sim default 0.05; else 1.0)",
    )
    where.add_argument("--duration", type=float, default=60.0, help="wall seconds")
    where.add_argument(
        "--warmup",
        type=float,
        default=0.0,
        help="wall seconds not measured: turns started before it and the engines' counters "
        "until then are left out (0: the whole run is measured, cold caches included)",
    )
    where.add_argument("--progress-s", type=float, default=5.0, help="progress line every S s")
    where.add_argument("--out", type=Path, default=None, help="write replay.json and replay.png")
    w = p.add_argument_group("workload (defaults: the seeds' traffic shape)")
    w.add_argument("--agents", type=int, default=d.agents, help="1-16 agents at once")
    w.add_argument("--turns", type=int, default=d.turns, help="turns per session")
    w.add_argument(
        "--shared-prefix",
        type=int,
        default=d.shared_prefix,
        help="system prompt + tools every session of one agent kind sends first, tokens",
    )
    w.add_argument(
        "--initial-context",
        type=int,
        default=d.initial_context,
        help="each session's own repository context, tokens",
    )
    w.add_argument(
        "--new-tokens",
        type=int,
        default=d.new_tokens,
        help="new prompt tokens per turn (tool output)",
    )
    w.add_argument(
        "--gen-tokens",
        type=int,
        default=d.gen_tokens,
        help="mean generated tokens per turn (log-normal)",
    )
    w.add_argument(
        "--gen-sigma", type=float, default=d.gen_sigma, help="log-normal sigma of --gen-tokens"
    )
    w.add_argument(
        "--think-s", type=float, default=d.think_s, help="tool/think time between turns, unscaled s"
    )
    w.add_argument(
        "--max-context", type=int, default=d.max_context, help="context at which a session compacts"
    )
    w.add_argument(
        "--temperature",
        type=_temperatures,
        default=d.temperatures,
        help="per agent, round robin: e.g. 0.7 | unset | 0.7,unset",
    )
    w.add_argument("--tools", type=int, default=d.tools, help="tool definitions per request")
    w.add_argument(
        "--tool-choice",
        choices=("none", "auto"),
        default=d.tool_choice,
        help="none: tools in the prompt, free text out; auto: the engine may call them",
    )
    w.add_argument("--subagent-rate", type=float, default=d.subagent_rate, help="per turn")
    w.add_argument(
        "--subagent-turns", type=int, default=d.subagent_turns, help="turns of a subagent session"
    )
    w.add_argument(
        "--api-mix",
        type=_mix,
        default=d.api_mix,
        help="e.g. chat=3,responses=1 (messages needs a target serving /v1/messages)",
    )
    w.add_argument("--model", default=d.model, help="model name sent")
    w.add_argument("--seed", type=int, default=d.seed, help="the workload's random seed")
    w.add_argument(
        "--patient",
        dest="watchdogs",
        action="store_false",
        help="agents wait for every turn (default: each keeps its agent's watchdogs and resends, "
        "loadtests/replay/watchdogs.py)",
    )
    return p


@dataclass
class Address:
    url: str
    verify: Any
    api_key: str | None
    metrics: list[str]
    pids: dict[str, list[int]] = field(default_factory=dict)
    kv_tokens: dict[str, int] = field(default_factory=dict)  # --sim: each engine's KV


@contextlib.contextmanager
def _simulated(args: argparse.Namespace, scale: float) -> Iterator[Address]:
    from loadtests.harness.device import DeviceSim
    from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy

    engines: list[tuple[str, str, float | None]] = []
    for spec in args.sim_engine or ["deep:dflash7-prob-block"]:
        name, profile, *share = spec.split(":")
        engines.append((name, profile, float(share[0]) if share else None))
    parser = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]
    extra = [*parser, "--kv-budget", str(args.kv_budget)]
    with DeviceSim(engines, time_scale=scale, overlap=args.overlap, extra=extra) as dev:
        assert dev.child.proc is not None
        pids = {"simulator": [dev.child.proc.pid]}
        metrics = list(dev.urls.values())
        kv = dict(dev.kv_tokens)
        print(
            f"replay: KV budget {args.kv_budget}: "
            + ", ".join(f"{name} {n:,} tokens" for name, n in kv.items()),
            file=sys.stderr,
        )
        if args.direct:
            yield Address(next(iter(dev.urls.values())), True, None, metrics, pids, kv)
            return
        with GatewayServer(coder_policy(dev.urls, defaults={})) as gw:
            assert gw.proc is not None
            verify = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
            pids = {**pids, "gateway": [gw.proc.pid]}
            yield Address(gw.base, verify, CLIENT_KEY, metrics, pids, kv)


def _counters(urls: list[str]) -> dict[str, float] | None:
    if not urls:
        return None
    out: dict[str, float] = {}
    for url in urls:
        for k, v in report.engine_counters(httpx.get(f"{url}/metrics", timeout=10).text).items():
            out[k] = out.get(k, 0.0) + v
    return out


async def _snapshot(delay_s: float, urls: list[str]) -> dict[str, float] | None:
    await asyncio.sleep(delay_s)
    return await asyncio.to_thread(_counters, urls)


async def _run(
    driver: Driver, progress_s: float, warmup_s: float, urls: list[str]
) -> tuple[list[TurnResult], dict[str, float] | None]:
    """The run, and the engines' counters at the end of the warm-up (None: no warm-up, or the
    run ended first)."""
    task = asyncio.ensure_future(driver.run())
    snap = asyncio.ensure_future(_snapshot(warmup_s, urls)) if warmup_s > 0 else None
    t0 = time.monotonic()
    while not task.done():
        await asyncio.wait([task], timeout=progress_s)
        if not task.done():
            ok = sum(1 for r in driver.results if r.error is None)
            print(
                f"  {time.monotonic() - t0:5.0f} s: {ok} turns done, "
                f"{len(driver.results) - ok} failed, {driver.in_flight} in flight",
                file=sys.stderr,
                flush=True,
            )
    if snap is not None and not snap.done():
        snap.cancel()
        return task.result(), None
    return task.result(), None if snap is None else snap.result()


def replay(
    args: argparse.Namespace, params: WorkloadParams, target: Address, scale: float
) -> dict[str, Any]:
    before = _counters(target.metrics)
    cpu0 = {who: cpu_seconds(p) for who, p in target.pids.items()}
    me0, t0 = self_cpu(), time.monotonic()
    driver = Driver(
        params,
        target.url,
        time_scale=scale,
        duration_s=args.duration,
        verify=target.verify,
        api_key=target.api_key,
        watchdogs=getattr(args, "watchdogs", True),
    )
    turns, warm = asyncio.run(_run(driver, args.progress_s, args.warmup, target.metrics))
    wall = time.monotonic() - t0
    cpu = {"client": (self_cpu() - me0) / wall}
    cpu.update({who: (cpu_seconds(p) - cpu0[who]) / wall for who, p in target.pids.items()})
    after = _counters(target.metrics)
    start = warm or before
    engines = None if start is None or after is None else report.delta(start, after)
    result = report.build(
        turns,
        params=asdict(params),
        time_scale=scale,
        wall_s=wall,
        engines=engines,
        cpu=cpu,
        warmup_s=args.warmup / scale if warm is not None else 0.0,
    )
    if target.kv_tokens:
        result["kv"] = {"budget": str(args.kv_budget), "tokens": target.kv_tokens}
    return result


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if not args.sim and not args.target:
        print("specrouter replay: give --target URL or --sim", file=sys.stderr)
        return 2
    try:
        params = WorkloadParams(
            agents=args.agents,
            turns=args.turns,
            shared_prefix=args.shared_prefix,
            initial_context=args.initial_context,
            new_tokens=args.new_tokens,
            gen_tokens=args.gen_tokens,
            gen_sigma=args.gen_sigma,
            think_s=args.think_s,
            max_context=args.max_context,
            temperatures=args.temperature,
            tools=args.tools,
            tool_choice=args.tool_choice,
            subagent_rate=args.subagent_rate,
            subagent_turns=args.subagent_turns,
            api_mix=args.api_mix,
            model=args.model,
            seed=args.seed,
        )
    except ValueError as err:
        print(f"specrouter replay: {err}", file=sys.stderr)
        return 2
    scale = args.time_scale or (0.05 if args.sim else 1.0)
    print(
        f"replay: {params.agents} agents for {args.duration:g} s wall at time scale {scale:g}",
        file=sys.stderr,
    )
    if args.sim:
        with _simulated(args, scale) as target:
            result = replay(args, params, target, scale)
    else:
        verify: Any = (
            False
            if args.insecure
            else (ssl.create_default_context(cafile=args.ca) if args.ca else True)
        )
        target = Address(args.target, verify, args.api_key, args.engine_metrics)
        result = replay(args, params, target, scale)
    print(report.text(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replay.json").write_text(json.dumps(result, indent=1))
        report.plot(result, args.out / "replay.png")
        print(f"wrote {args.out / 'replay.json'} and {args.out / 'replay.png'}")
    return 1 if result["overall"]["turns"] == 0 else 0
