"""What an agent's 406 KiB body adds, the targets alternated request by request: `python -m
loadtests.bench.overhead.bodies [--requests N] [--apis chat,responses,messages]
[--baseline-commit REV | --baseline-gateway CHECKOUT]`.

The agents' rounds (agents.py) measure each target in a round of its own, ~9 requests at one
stream: a body's figure minus the one-line figure of another round moved by more than the
0.1 ms the goals allow. Here, as in interleaved.py, every target gets one request in turn on
its own kept-alive TLS connection, for each API the one-line prompt then the agent's body
(loadtests/bench/agent_body.py), the targets in a seeded random order each time (interleaved.py
says why not a rotation). Per request: TTFT, and the target's CPU time over the request (the
scheduler's clock, /proc/PID/task/*/schedstat, read before the request is sent and after its
last byte), so work the target does between requests is not counted. "What the body adds" is,
per turn, the body request's figure minus the one-line request's of the same target; the
report gives the median of those with the interquartile range, beside `relay_json`'s (one
parse and one write of the body: the goals' allowance) and the paired differences to it.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from dataclasses import dataclass, field

from loadtests.bench.agent_body import Api
from loadtests.bench.overhead import baseline
from loadtests.bench.overhead.agents import CHUNKS, KIB, PATHS, Scenario, body_bytes, request
from loadtests.bench.overhead.client import Pool, Tally
from loadtests.bench.overhead.stack import Stack
from loadtests.harness.procfs import cpu_ns

_ARMS = ("direct", "gateway", "baseline", "relay", "relay_json")
SIZE = 406 * KIB
STEP_MS = 2.0  # TTFT does not depend on it; the one-line and body requests share it
WARM = 20  # turns dropped


@dataclass
class Figures:
    """Per (target, api, body): one value per kept turn."""

    ttft_ms: dict[tuple[str, Api, bool], list[float]] = field(default_factory=dict)
    cpu_us: dict[tuple[str, Api, bool], list[float]] = field(default_factory=dict)


async def run(stack: Stack, requests: int, apis: list[Api], seed: int, warm: int = WARM) -> Figures:
    """`requests` kept turns after `warm` dropped ones."""
    arms = [a for a in _ARMS if a in stack.targets]
    pools = {a: Pool(stack.targets[a], Tally()) for a in arms}
    conns = {a: (await pools[a].ensure(1))[0] for a in arms}
    scenarios = {
        (api, big): Scenario(api, SIZE if big else 0, 1) for api in apis for big in (False, True)
    }
    payloads = {
        (a, api, big): request(stack.targets[a], sc, body_bytes(sc, STEP_MS))
        for (api, big), sc in scenarios.items()
        for a in arms
    }
    rng = random.Random(seed)
    out = Figures()
    try:
        for i in range(requests + warm):
            for api, big in scenarios:
                for a in rng.sample(arms, len(arms)):
                    pids = stack.targets[a].pids()
                    before = cpu_ns(pids)
                    shot = await asyncio.wait_for(
                        conns[a].request(payloads[(a, api, big)], record_times=False), 30
                    )
                    spent = cpu_ns(pids) - before
                    if not shot.ok or shot.t_first is None:
                        raise RuntimeError(f"{a} {api}: a failed response (status {shot.status})")
                    if i >= warm:
                        key = (a, api, big)
                        out.ttft_ms.setdefault(key, []).append((shot.t_first - shot.t_sent) * 1e3)
                        out.cpu_us.setdefault(key, []).append(spent / 1e3)
                    await asyncio.sleep(rng.uniform(0.003, 0.008))
    finally:
        for pool in pools.values():
            pool.abort()
    return out


def _spread(values: list[float], fmt: str = "+.3f") -> str:
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return f"{q2:{fmt}} ({q1:{fmt}} to {q3:{fmt}})"


def _adds(series: dict[tuple[str, Api, bool], list[float]], a: str, api: Api) -> list[float]:
    return [b - o for b, o in zip(series[(a, api, True)], series[(a, api, False)], strict=True)]


def report(fig: Figures, requests: int) -> str:
    arms = [a for a in _ARMS if any(k[0] == a for k in fig.ttft_ms)]
    apis = list(dict.fromkeys(k[1] for k in fig.ttft_ms))
    lines = [
        f"what a {SIZE // KIB} KiB agent body adds over the one-line prompt of its API: "
        f"{requests} turns after {WARM}, targets alternated request by request, one kept-alive "
        f"connection each, {CHUNKS}-chunk streams at {STEP_MS:g} ms a step, 3-8 ms between "
        "requests; per turn, body minus one-line: median (interquartile range)",
    ]
    for api in apis:
        lines += [
            "",
            f"{api}:",
            "| target | TTFT, one-line (ms) | the body adds (ms) | CPU, one-line (us) "
            "| the body adds (us) |",
            "|---|---|---|---|---|",
        ]
        for a in arms:
            ttft, cpu = fig.ttft_ms[(a, api, False)], fig.cpu_us[(a, api, False)]
            lines.append(
                f"| {a} | {statistics.median(ttft):.3f} | {_spread(_adds(fig.ttft_ms, a, api))} "
                f"| {statistics.median(cpu):.0f} | {_spread(_adds(fig.cpu_us, a, api), '+.0f')} |"
            )
        for a in ("gateway", "baseline"):
            if a not in arms or "relay_json" not in arms:
                continue
            for name, series, fmt in (
                ("TTFT, ms", fig.ttft_ms, "+.3f"),
                ("CPU, us", fig.cpu_us, "+.0f"),
            ):
                mine, allowed = _adds(series, a, api), _adds(series, "relay_json", api)
                pair = [x - y for x, y in zip(mine, allowed, strict=True)]
                lines.append(
                    f"  {a} - relay_json, what the body adds ({name}): {_spread(pair, fmt)}"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.overhead.bodies")
    ap.add_argument("--requests", type=int, default=300, help="turns (one request per target)")
    ap.add_argument("--apis", default="chat,responses,messages")
    ap.add_argument("--seed", type=int, default=1)
    baseline.add_arguments(ap)
    args = ap.parse_args(argv)
    wanted = args.apis.split(",")
    unknown = [name for name in wanted if name not in PATHS]
    if unknown:
        ap.error(f"--apis: {', '.join(unknown)}: not among {', '.join(PATHS)}")
    apis = [api for api in PATHS if api in wanted]
    with baseline.alternated_stack(args) as stack:
        fig = asyncio.run(run(stack, args.requests, apis, args.seed))
    print(report(fig, args.requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
