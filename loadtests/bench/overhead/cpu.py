"""CPU accounting of a round: two samples of the proxy's, the pacer's and the client's CPU."""

from __future__ import annotations

from dataclasses import dataclass

from loadtests.bench.overhead.result import RoundResult


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: the proxy's (user, system), the pacer's, this client's; and the clock."""

    user: float
    system: float
    pacer: float
    client: float
    wall: float


def account(res: RoundResult, before: CpuSample, after: CpuSample, proxy: bool) -> None:
    """A round's CPU figures from two samples; per chunk once `res.chunks` is set."""
    res.wall_s = after.wall - before.wall
    cpu = (after.user + after.system) - (before.user + before.system)
    if proxy and res.chunks:
        res.cpu_s = cpu
        res.cpu_per_chunk_us = cpu / res.chunks * 1e6
        res.cpu_pct = cpu / res.wall_s * 100
        res.extra["user_us_per_chunk"] = (after.user - before.user) / res.chunks * 1e6
        res.extra["sys_us_per_chunk"] = (after.system - before.system) / res.chunks * 1e6
    res.pacer_cpu_pct = (after.pacer - before.pacer) / res.wall_s * 100
    res.client_cpu_pct = (after.client - before.client) / res.wall_s * 100
