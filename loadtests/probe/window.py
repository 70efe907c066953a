"""A probe run's counter window and figures: counter readings, idleness, tallies, results."""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from loadtests.probe.config import MetricsSource, PrefillResult, ProbeConfig, RunResult
from loadtests.probe.frames import per_token
from loadtests.probe.metrics import Reading, parse_engine, parse_gateway, total, window_figures
from loadtests.probe.stats import p50_p95


@dataclass(slots=True)
class RunState:
    n: int
    measuring: bool = False
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)  # between token chunks
    gap_tokens: list[int] = field(default_factory=list)  # tokens each gap produced (0: unknown)
    requests: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    variants: Counter[str] = field(default_factory=Counter)
    defaults: Counter[str] = field(default_factory=Counter)
    decoding: set[int] = field(default_factory=set)
    all_decoding: asyncio.Event = field(default_factory=asyncio.Event)
    # The hand-over (Probe._stream): streams holding a warm-up open, and each one's turn.
    holding: set[int] = field(default_factory=set)
    turns: list[asyncio.Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.turns = [asyncio.Event() for _ in range(self.n)]

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:300])


# -- counters --------------------------------------------------------------------------------


async def _read_source(client: httpx.AsyncClient, src: MetricsSource) -> dict[str, Reading]:
    hdr = {"authorization": f"Bearer {src.key}"} if src.key else {}
    try:
        resp = await client.get(src.url, timeout=10.0, headers=hdr)
    except httpx.RemoteProtocolError:
        # The server closed a pooled keep-alive connection as this GET went out on it (its idle
        # timeout, reached when a loaded machine stretches a window): the GET is idempotent,
        # and a second one takes a fresh connection.
        resp = await client.get(src.url, timeout=10.0, headers=hdr)
    resp.raise_for_status()
    if src.kind == "engine":
        return {src.url: parse_engine(resp.text)}
    per_backend = parse_gateway(resp.text)
    names = list(per_backend) if src.backends is None else list(src.backends)
    return {f"{src.url}#{b}": per_backend.get(b, Reading()) for b in names}


async def read_counters(
    client: httpx.AsyncClient, srcs: Sequence[MetricsSource], *, aligned: bool
) -> tuple[float, dict[str, Reading]]:
    """(monotonic time of the reading, readings by source label).

    The generation counter moves in jumps: once per engine step (N sequences x accepted
    tokens), and for the gateway's re-export once per scrape. With `aligned`, poll until
    it moves, so that both ends of a window sit just after a jump and the window holds
    whole steps (or scrapes): the error is one poll, not one step or one scrape interval.
    """
    t0 = time.monotonic()
    parts = await asyncio.gather(*(_read_source(client, s) for s in srcs))
    t1 = time.monotonic()
    first = {k: v for p in parts for k, v in p.items()}
    if not aligned:
        return (t0 + t1) / 2, first
    poll = 0.01 if any(s.kind == "gateway" for s in srcs) else 0.002
    base = total(first.values()).get("generation")
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline:
        await asyncio.sleep(poll)
        t0 = time.monotonic()
        parts = await asyncio.gather(*(_read_source(client, s) for s in srcs))
        t1 = time.monotonic()
        now = {k: v for p in parts for k, v in p.items()}
        if total(now.values()).get("generation") != base:
            return (t0 + t1) / 2, now
    return (t0 + t1) / 2, first


async def wait_idle(client: httpx.AsyncClient, cfg: ProbeConfig, real_s: float = 15.0) -> bool:
    """Until the engines run and queue nothing (the previous run's streams are aborted)."""
    deadline = time.monotonic() + real_s
    while time.monotonic() < deadline:
        try:
            _, readings = await read_counters(client, cfg.sources, aligned=False)
        except httpx.HTTPError:
            await asyncio.sleep(0.1)
            continue
        busy = total(readings.values())
        if busy.get("running") + busy.get("waiting") == 0 and await _gateway_idle(client, cfg):
            return True
        await asyncio.sleep(0.05)
    return False


async def gateway_in_flight_at_most(
    client: httpx.AsyncClient, cfg: ProbeConfig, n: int, real_s: float
) -> bool:
    """Until the gateway counts at most `n` requests in flight (it has seen a client leave)."""
    hdr = {"authorization": f"Bearer {cfg.admin_token}"} if cfg.admin_token else {}
    deadline = time.monotonic() + real_s
    while time.monotonic() < deadline:
        try:
            resp = await client.get(f"{cfg.admin_url}/admin/status", headers=hdr, timeout=10.0)
            if resp.status_code == 200 and int(resp.json().get("in_flight") or 0) <= n:
                return True
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.01)
    return False


async def _gateway_idle(client: httpx.AsyncClient, cfg: ProbeConfig) -> bool:
    if not cfg.admin_url:
        return True
    hdr = {"authorization": f"Bearer {cfg.admin_token}"} if cfg.admin_token else {}
    try:
        resp = await client.get(f"{cfg.admin_url}/admin/status", headers=hdr)
    except httpx.HTTPError:
        return True
    if resp.status_code != 200:
        return True  # not readable (no token): nothing to wait for
    data = resp.json()
    if data.get("in_flight"):
        return False
    return all(
        not (b.get("in_flight") or b.get("running") or b.get("waiting"))
        for b in (data.get("backends") or {}).values()
    )


# -- figures ---------------------------------------------------------------------------------


def run_result(
    st: RunState,
    temperature: float | None,
    run: int,
    window: float,
    before: dict[str, Reading],
    after: dict[str, Reading],
    *,
    scale: float,
    started_at: str,
) -> RunResult:
    """One run's figures: `window` unscaled seconds between the `before` and `after` readings."""
    n = st.n
    fig = window_figures(total(before.values()), total(after.values()), window)
    ttft = p50_p95([1000.0 * x / scale for x in st.ttft])
    itl = p50_p95(
        [1000.0 * x / scale for x in per_token(st.gaps, st.gap_tokens, fig.tokens_per_step)]
    )
    gap = p50_p95([1000.0 * x / scale for x in st.gaps])
    sources = {
        k: max(0.0, after[k].get("generation") - before[k].get("generation"))
        for k in after
        if k in before
    }
    return RunResult(
        concurrency=n,
        temperature=temperature,
        run=run,
        window_s=window,
        generated=fig.generated,
        tok_s=fig.tok_s,
        per_stream_tok_s=fig.tok_s / n,
        tokens_per_step=fig.tokens_per_step,
        accept_per_pos=list(fig.accept_per_pos),
        ttft_p50_ms=ttft[0],
        ttft_p95_ms=ttft[1],
        itl_p50_ms=itl[0],
        itl_p95_ms=itl[1],
        requests=st.requests,
        errors=st.errors,
        error_samples=st.error_samples,
        variants=dict(st.variants),
        defaults=dict(st.defaults),
        sources=sources,
        started_at=started_at,
        chunk_gap_p50_ms=gap[0],
        chunk_gap_p95_ms=gap[1],
    )


def result_line(result: RunResult) -> str:
    """The progress line's account of a finished run."""
    tps = "" if result.tokens_per_step is None else f", {result.tokens_per_step:.2f} tokens/step"
    via = (
        " via " + ", ".join(f"{k} x{v}" for k, v in sorted(result.variants.items()))
        if result.variants
        else ""
    )
    return f"-> {result.tok_s:.1f} tokens/s{tps}, {result.errors} error(s){via}"


def prefill_result(
    usage: int | None,
    before: dict[str, Reading],
    after: dict[str, Reading],
    seconds: float,
    estimate: int,
) -> PrefillResult:
    """The prompt's tokens from its usage, else the counters, else the `estimate` asked for."""
    counted = total(after.values()).get("prompt") - total(before.values()).get("prompt")
    if usage is not None:
        tokens, source = usage, "usage"
    elif counted > 0:
        tokens, source = int(counted), "counter"
    else:
        tokens, source = estimate, "estimate"
    return PrefillResult(tokens, seconds, tokens / seconds if seconds > 0 else math.nan, source)
