"""The rounds: closed-loop paced streams, saturation, many streams held open."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.bench.overhead.client import ClientConn, Pool, Shot, Tally, request_bytes
from loadtests.bench.overhead.cpu import CpuSample, account
from loadtests.bench.overhead.result import RoundResult
from loadtests.bench.overhead.stack import Arm, Stack
from loadtests.harness.procfs import cpu_ns, cpu_seconds, cpu_split, rss_bytes, self_cpu


@dataclass(frozen=True)
class Spec:
    kind: str  # ttft1 | paced16 | sat | rss256
    streams: int
    step_ms: float
    max_tokens: int
    duration_s: float  # arrivals window (closed loop), measuring window (sat), hold (rss)
    spread_s: float  # arrivals: exponential gaps with mean spread/streams
    think_s: tuple[float, float] = (0.0, 0.0)
    warmup_s: float = 0.0


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def arrivals(rng: random.Random, n: int, spread: float) -> list[float]:
    """Staggered start offsets: a Poisson process of n arrivals, about `spread` long."""
    if n <= 1 or spread <= 0:
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(n / spread)
    return out


class Bench:
    def __init__(self, stack: Stack, *, prompt_bytes: int = 4096) -> None:
        self.stack = stack
        self.tally = Tally()
        self.pools = {name: Pool(t, self.tally) for name, t in stack.targets.items()}
        self.prompt_bytes = prompt_bytes
        assert stack.pacer is not None
        self.pacer_pid = stack.pacer.pid

    def close(self) -> None:
        for pool in self.pools.values():
            pool.abort()

    def _payload(self, target: Arm, spec: Spec, max_tokens: int | None = None) -> bytes:
        return request_bytes(
            target,
            max_tokens=max_tokens or spec.max_tokens,
            step_ms=spec.step_ms,
            prompt_bytes=self.prompt_bytes,
        )

    def _sample(self, pids: list[int]) -> CpuSample:
        (user, system), pacer = cpu_split(pids), cpu_seconds([self.pacer_pid])
        return CpuSample(user, system, pacer, self_cpu(), time.perf_counter())

    async def closed_loop(
        self, name: str, spec: Spec, repeat: int, seed: int, payload: bytes | None = None
    ) -> RoundResult:
        """Each stream: arrive, request, read to the end, think, repeat until the window ends.
        `payload`: the request (head and body) when not the one-line chat of `spec`."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = payload or self._payload(target, spec)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        shots: list[Shot] = []
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02
        deadline = start + spec.duration_s
        record = spec.kind == "paced16"

        async def stream(i: int, conn: ClientConn) -> None:
            rng = random.Random(seed * 7919 + i)
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            while loop.time() < deadline:
                shots.append(await conn.request(payload, record_times=record))
                await asyncio.sleep(rng.uniform(*spec.think_s))

        pids = target.pids() if name != "direct" else []
        before, ns0 = self._sample(pids), cpu_ns(pids)
        longest = spec.max_tokens * spec.step_ms / 1000.0 + spec.spread_s
        try:
            async with asyncio.timeout(spec.duration_s + longest + 20):
                errors = [
                    e
                    for e in await asyncio.gather(
                        *(stream(i, c) for i, c in enumerate(conns)), return_exceptions=True
                    )
                    if isinstance(e, BaseException)
                ]
            if errors:
                raise errors[0]
        except (TimeoutError, ConnectionError, OSError) as exc:
            res.ok, res.error = False, f"{type(exc).__name__}: {exc}"
            pool.abort()
        after, ns1 = self._sample(pids), cpu_ns(pids)
        expected = spec.max_tokens + 2  # role, one event per token (1 token/chunk), [DONE]
        good = [s for s in shots if s.ok and s.frames == expected and s.t_first is not None]
        res.requests, res.failed = len(shots), len(shots) - len(good)
        if res.failed:
            res.ok = False
            res.error = res.error or f"{res.failed} of {len(shots)} responses incomplete"
        res.chunks = sum(s.frames - 1 for s in good)
        ttfts = [(s.t_first - s.t_sent) * 1000 for s in good if s.t_first is not None]
        res.ttft_p50_ms = pct(ttfts, 50)
        if record:
            gaps: list[float] = []
            for s in good:
                if s.times is not None:
                    t = s.times[1:-1]  # decode events: first token's to the last one
                    gaps += [(b - a) * 1000 for a, b in zip(t, t[1:], strict=False)]
            res.gap_p99_ms = pct(gaps, 99)
            res.extra["gaps"] = len(gaps)
            res.extra["gap_p50_ms"] = pct(gaps, 50)
        res.extra["ttft_samples"] = len(ttfts)
        account(res, before, after, bool(pids))
        if pids and good and ns1 > ns0:  # the scheduler's ns, not utime+stime's 10 ms ticks
            res.extra["cpu_per_request_ms"] = (ns1 - ns0) / len(good) / 1e6
        return res

    async def saturate(self, name: str, spec: Spec, repeat: int, seed: int) -> RoundResult:
        """Streams as fast as the target relays them; rate and CPU over a fixed window."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = self._payload(target, spec, max_tokens=10_000_000)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02

        async def stream(i: int, conn: ClientConn) -> Shot:
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            return await conn.request(payload, record_times=False)

        tasks = [asyncio.ensure_future(stream(i, c)) for i, c in enumerate(conns)]
        pids = target.pids() if name != "direct" else []
        try:
            await asyncio.sleep(spec.spread_s + spec.warmup_s)
            f0, before = self.tally.frames, self._sample(pids)
            await asyncio.sleep(spec.duration_s)
            f1, after = self.tally.frames, self._sample(pids)
            broken = [t for t in tasks if t.done()]
            if broken:
                res.ok, res.error = False, f"{len(broken)} streams ended during the window"
        finally:
            pool.abort()
            await asyncio.gather(*tasks, return_exceptions=True)
        res.chunks = f1 - f0
        account(res, before, after, bool(pids))
        res.rate = res.chunks / res.wall_s
        await asyncio.sleep(0.3)  # let the proxy and the pacer wind the dropped streams down
        return res

    async def hold_open(self, name: str, spec: Spec, repeat: int, seed: int) -> RoundResult:
        """`spec.streams` streams open at once; the proxy's resident memory while they stream."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = self._payload(target, spec, max_tokens=10_000_000)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02
        shots: list[Shot] = []

        async def stream(i: int, conn: ClientConn) -> Shot:
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            fut = conn.request(payload, record_times=False)
            assert conn.shot is not None
            shots.append(conn.shot)
            return await fut

        tasks = [asyncio.ensure_future(stream(i, c)) for i, c in enumerate(conns)]
        pids = target.pids()
        rss_before = rss_bytes(pids)
        samples: list[int] = []
        try:
            async with asyncio.timeout(spec.spread_s + 30):
                while len(shots) < spec.streams or any(s.t_first is None for s in shots):
                    if any(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.05)
            res.extra["open"] = sum(1 for s in shots if s.t_first is not None)
            end = loop.time() + spec.duration_s
            while loop.time() < end:
                samples.append(rss_bytes(pids))
                await asyncio.sleep(0.1)
            if any(t.done() for t in tasks):
                res.ok, res.error = False, "some streams ended while held open"
        except TimeoutError:
            res.ok, res.error = False, "streams did not all start"
        finally:
            pool.abort()
            await asyncio.gather(*tasks, return_exceptions=True)
        res.rss_mb = max(samples) / 1e6 if samples else None
        res.extra["rss_before_mb"] = rss_before / 1e6
        await asyncio.sleep(0.5)
        return res
