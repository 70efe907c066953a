"""One-line TTFT, the targets alternated request by request: `python -m
loadtests.bench.overhead.interleaved [--requests N] [--baseline-gateway CHECKOUT]`.

The `ttft1` round of the overhead benchmark measures each target in a round of its own (2 s,
~75 requests), so what the machine does during one round and not the next (another process,
the CPU's clock, the timer's phase) lands in one target's figure: on this 2-core machine the
gateway-minus-relay difference of one repeat moved by 0.2-0.3 ms between repeats of one run,
more than the 0.1 ms the goal allows. Here every target gets one request in turn, in a seeded
random order each turn, on its own kept-alive connection (TLS to the proxies, as in `ttft1`:
the same one-line chat stream, 4 tokens at a 5 ms step, 5-15 ms of thinking between
requests), so drift falls on all targets alike. Not in a rotating order: then each target
always runs right after the same one, and what that one leaves in the caches the processes
share (probably the interpreter's and the libraries' code) lands in its figure: with the
baseline always right after the gateway, four A/A runs (one commit as both, bodies.py) read
the baseline's one-line TTFT 0.02-0.14 ms below the gateway's; shuffled, two runs read
-0.03 to +0.03. Each turn gives one paired difference per target against the bare relay
(and the baseline); the report is their median with the interquartile range, the medians of
each target's own TTFT beside them.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics

from loadtests.bench.overhead import baseline
from loadtests.bench.overhead.client import Pool, Tally, request_bytes
from loadtests.bench.overhead.stack import Stack

_ARMS = ("direct", "gateway", "baseline", "relay")


async def run(stack: Stack, requests: int, prompt_bytes: int, seed: int) -> dict[str, list[float]]:
    """TTFT (ms) per target, one list each, index i from turn i."""
    arms = [a for a in _ARMS if a in stack.targets]
    tally = Tally()
    pools = {a: Pool(stack.targets[a], tally) for a in arms}
    conns = {a: (await pools[a].ensure(1))[0] for a in arms}
    payloads = {
        a: request_bytes(stack.targets[a], max_tokens=4, step_ms=5.0, prompt_bytes=prompt_bytes)
        for a in arms
    }
    rng = random.Random(seed)
    ttft: dict[str, list[float]] = {a: [] for a in arms}
    try:
        for i in range(requests + 20):  # the first 20 turns warm the caches and are dropped
            for a in rng.sample(arms, len(arms)):
                shot = await asyncio.wait_for(conns[a].request(payloads[a], record_times=False), 30)
                if not shot.ok or shot.t_first is None:
                    raise RuntimeError(f"{a}: a failed response (status {shot.status})")
                if i >= 20:
                    ttft[a].append((shot.t_first - shot.t_sent) * 1000)
                await asyncio.sleep(rng.uniform(0.005, 0.015))
    finally:
        for pool in pools.values():
            pool.abort()
    return ttft


def report(ttft: dict[str, list[float]], requests: int) -> str:
    lines = [
        f"one-line TTFT, targets alternated request by request: {requests} turns after 20 of "
        "warm-up, one kept-alive connection each, 4-token streams at a 5 ms step, 5-15 ms "
        "between requests; ms",
        "| target | TTFT p50 | added over direct, p50 |",
        "|---|---|---|",
    ]
    direct = ttft.get("direct")
    for a, values in ttft.items():
        added = ""
        if direct is not None and a != "direct":
            added = f"{statistics.median([v - d for v, d in zip(values, direct, strict=True)]):.3f}"
        lines.append(f"| {a} | {statistics.median(values):.3f} | {added} |")
    lines.append("")
    lines.append("paired per turn: median (interquartile range), ms")
    for a, b in (("gateway", "relay"), ("baseline", "relay"), ("gateway", "baseline")):
        if a in ttft and b in ttft:
            diffs = [x - y for x, y in zip(ttft[a], ttft[b], strict=True)]
            q1, q2, q3 = statistics.quantiles(diffs, n=4)
            lines.append(f"  {a} - {b}: {q2:+.3f} ({q1:+.3f} to {q3:+.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.overhead.interleaved")
    ap.add_argument("--requests", type=int, default=600, help="turns (one request per target)")
    ap.add_argument("--prompt-bytes", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1)
    baseline.add_arguments(ap)
    args = ap.parse_args(argv)
    with baseline.alternated_stack(args) as stack:
        ttft = asyncio.run(run(stack, args.requests, args.prompt_bytes, args.seed))
    print(report(ttft, args.requests))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
