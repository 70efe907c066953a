"""The plan of a run: which rounds, how long, in which order per repeat."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.bench.overhead.result import RoundResult
from loadtests.bench.overhead.rounds import Bench, Spec
from loadtests.bench.overhead.stack import AGENTS_ONLY, TARGETS
from loadtests.harness.procfs import rss_bytes


@dataclass(frozen=True)
class Plan:
    repeats: int
    rss_repeats: int
    ttft1: Spec
    paced16: Spec
    sat: Spec
    rss256: Spec


def make_plan(quick: bool, repeats: int | None, paced_tokens: int = 48) -> Plan:
    if quick:
        return Plan(
            repeats=repeats or 2,
            rss_repeats=1,
            ttft1=Spec("ttft1", 1, 5.0, 4, 1.0, 0.0, (0.005, 0.015)),
            paced16=Spec("paced16", 16, 30.0, paced_tokens, 3.0, 0.5, (0.02, 0.2)),
            sat=Spec("sat", 16, 0.0, 0, 1.5, 0.1, warmup_s=0.4),
            rss256=Spec("rss256", 256, 100.0, 0, 1.0, 1.0),
        )
    return Plan(
        repeats=repeats or 5,
        rss_repeats=2,
        ttft1=Spec("ttft1", 1, 5.0, 4, 2.0, 0.0, (0.005, 0.015)),
        paced16=Spec("paced16", 16, 30.0, paced_tokens, 5.0, 0.5, (0.02, 0.2)),
        sat=Spec("sat", 16, 0.0, 0, 3.0, 0.1, warmup_s=0.5),
        rss256=Spec("rss256", 256, 100.0, 0, 1.5, 1.0),
    )


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _short(r: RoundResult) -> str:
    parts = [f"{r.kind:<8} {r.target:<8}"]
    if r.ttft_p50_ms is not None:
        parts.append(f"ttft50={r.ttft_p50_ms:.2f}ms")
    if r.gap_p99_ms is not None:
        parts.append(f"gap99={r.gap_p99_ms:.2f}ms")
    if r.rate is not None:
        parts.append(f"rate={r.rate:,.0f}/s")
    if r.kind == "ttft1" and "cpu_per_request_ms" in r.extra:
        parts.append(f"cpu={r.extra['cpu_per_request_ms']:.2f}ms/request")
    elif r.cpu_per_chunk_us is not None:
        parts.append(
            f"cpu={r.cpu_per_chunk_us:.1f}us/chunk "
            f"(user {r.extra.get('user_us_per_chunk', 0):.1f} "
            f"sys {r.extra.get('sys_us_per_chunk', 0):.1f}; {r.cpu_pct:.0f}%)"
        )
    if r.rss_mb is not None:
        parts.append(f"rss={r.rss_mb:.1f}MB")
    if r.requests:
        parts.append(f"req={r.requests}")
    parts.append(f"pacer={r.pacer_cpu_pct or 0:.0f}% client={r.client_cpu_pct or 0:.0f}%")
    if not r.ok:
        parts.append(f"FAILED: {r.error}")
    return "  " + " ".join(parts)


async def run_plan(bench: Bench, plan: Plan, *, kinds: Sequence[str]) -> list[RoundResult]:
    names = [n for n in TARGETS if n in bench.stack.targets]
    results: list[RoundResult] = []
    warm = Spec("warmup", 16, 1.0, 8, 0.5, 0.1, (0.0, 0.01))
    for name in names:  # open the proxies' upstream pools, page everything in
        await bench.closed_loop(name, warm, -1, 1)
    names = [n for n in names if n not in AGENTS_ONLY]  # warmed above, measured by agents.py
    proxies = [n for n in names if n != "direct"]
    for name in proxies:
        results.append(
            RoundResult(
                name, "rss_idle", -1, rss_mb=rss_bytes(bench.stack.targets[name].pids()) / 1e6
            )
        )
    if "rss256" in kinds:
        # First, before the long unpaced streams of `sat` leave their traces in the heap
        # (the figure for those is `rss_end`, at the end of the run).
        for r in range(plan.rss_repeats):
            for name in proxies[r % len(proxies) :] + proxies[: r % len(proxies)]:
                res = await bench.hold_open(name, plan.rss256, r, 5000 + r)
                results.append(res)
                log(_short(res))
    for r in range(plan.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        log(f"repeat {r + 1}/{plan.repeats} (order {' / '.join(order)})")
        for spec in (plan.ttft1, plan.paced16, plan.sat):
            if spec.kind not in kinds:
                continue
            seed = 1000 * r + len(spec.kind)
            for name in order:
                if spec.kind == "sat":
                    res = await bench.saturate(name, spec, r, seed)
                else:
                    res = await bench.closed_loop(name, spec, r, seed)
                results.append(res)
                log(_short(res))
    await asyncio.sleep(1.0)
    for name in proxies:
        results.append(
            RoundResult(
                name, "rss_end", -1, rss_mb=rss_bytes(bench.stack.targets[name].pids()) / 1e6
            )
        )
    return results
