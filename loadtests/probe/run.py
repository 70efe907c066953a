"""The probe's measurement loop: N concurrent code-generation streams, a counter window, a prefill.

One *run* of a cell (N streams, one temperature):

1. open N streams (closed loop: a stream whose request ends opens the next one). With
   `warmup_requests` > 0 each stream first sends that many short requests, so that a gateway's
   load rule sees the steady concurrency before the measured requests are routed;
2. wait until every stream's long request is decoding, then `warmup_s` more (unscaled);
3. read the engine counters, wait `window_s` (unscaled), read them again: decode tokens/s is
   delta(generation tokens) / window, accepted tokens per step and per-position acceptance come
   from the spec-decode counters. Client-side TTFT (of the long requests) and the gaps between
   token chunks (inside the window) are timed on the client: the chunk gap, and ITL per token
   (each chunk's tokens from its continuous usage, else the counters' tokens per step);
4. close the streams (the server aborts them) and wait until the engine is idle.

Every duration is unscaled: a simulated backend running `--time-scale F` is waited on F times
shorter, and every figure is divided back. Counters re-exported by the gateway are as old as its
last scrape, so their window edges are aligned on a change of the re-exported value.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import math
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from loadtests.probe import prompts
from loadtests.probe.config import MetricsSource, PrefillResult, ProbeConfig, RunResult
from loadtests.probe.frames import _frame_kind, _usage_prompt_tokens, completion_tokens, per_token
from loadtests.probe.metrics import Reading, parse_engine, parse_gateway, total, window_figures
from loadtests.probe.progress import Progress, fmt_duration
from loadtests.probe.stats import p50_p95, temp_label

# Where the probe's callers (the command, the policy sweep, the report) have always found them.
__all__ = [
    "MetricsSource",
    "PrefillResult",
    "Probe",
    "ProbeConfig",
    "Progress",
    "RunResult",
    "Stopped",
    "_frame_kind",
    "fmt_duration",
]


class Stopped(Exception):
    """Ctrl-C, or a bound (time, requests) reached."""


@dataclass(slots=True)
class _RunState:
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

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:300])


class Probe:
    def __init__(self, cfg: ProbeConfig, progress: Progress | None = None) -> None:
        self.cfg = cfg
        self.progress = progress or Progress(quiet=True)
        self.stop = asyncio.Event()
        self.stop_reason = ""
        self.requests = 0
        self.results: list[RunResult] = []
        self.prefill: PrefillResult | None = None
        self.rejected: list[tuple[RunResult, str]] = []
        self._run_seconds: list[float] = []
        self._t_start = 0.0
        self._client: httpx.AsyncClient | None = None

    # -- helpers ---------------------------------------------------------------------------------

    @property
    def scale(self) -> float:
        return self.cfg.time_scale

    def _headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.cfg.key}"} if self.cfg.key else {}

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    async def _sleep(self, real_s: float) -> None:
        """Sleep, or raise Stopped as soon as the probe is asked to stop."""
        if self.stop.is_set():
            raise Stopped(self.stop_reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), max(0.0, real_s))
        if self.stop.is_set():
            raise Stopped(self.stop_reason)

    async def _wait_event(self, ev: asyncio.Event, real_s: float) -> bool:
        waiter = asyncio.ensure_future(ev.wait())
        stopper = asyncio.ensure_future(self.stop.wait())
        try:
            await asyncio.wait(
                {waiter, stopper}, timeout=real_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            waiter.cancel()
            stopper.cancel()
        if self.stop.is_set():
            raise Stopped(self.stop_reason)
        return ev.is_set()

    # -- counters --------------------------------------------------------------------------------

    async def _read_source(
        self, client: httpx.AsyncClient, src: MetricsSource
    ) -> dict[str, Reading]:
        hdr = {"authorization": f"Bearer {src.key}"} if src.key else {}
        resp = await client.get(src.url, timeout=10.0, headers=hdr)
        resp.raise_for_status()
        if src.kind == "engine":
            return {src.url: parse_engine(resp.text)}
        per_backend = parse_gateway(resp.text)
        names = list(per_backend) if src.backends is None else list(src.backends)
        return {f"{src.url}#{b}": per_backend.get(b, Reading()) for b in names}

    async def read_counters(
        self, client: httpx.AsyncClient, *, aligned: bool
    ) -> tuple[float, dict[str, Reading]]:
        """(monotonic time of the reading, readings by source label).

        The generation counter moves in jumps: once per engine step (N sequences x accepted
        tokens), and for the gateway's re-export once per scrape. With `aligned`, poll until
        it moves, so that both ends of a window sit just after a jump and the window holds
        whole steps (or scrapes): the error is one poll, not one step or one scrape interval.
        """
        srcs = self.cfg.sources
        t0 = time.monotonic()
        parts = await asyncio.gather(*(self._read_source(client, s) for s in srcs))
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
            parts = await asyncio.gather(*(self._read_source(client, s) for s in srcs))
            t1 = time.monotonic()
            now = {k: v for p in parts for k, v in p.items()}
            if total(now.values()).get("generation") != base:
                return (t0 + t1) / 2, now
        return (t0 + t1) / 2, first

    async def wait_idle(self, client: httpx.AsyncClient, real_s: float = 15.0) -> bool:
        """Until the engines run and queue nothing (the previous run's streams are aborted)."""
        deadline = time.monotonic() + real_s
        while time.monotonic() < deadline:
            try:
                _, readings = await self.read_counters(client, aligned=False)
            except httpx.HTTPError:
                await asyncio.sleep(0.1)
                continue
            busy = total(readings.values())
            if busy.get("running") + busy.get("waiting") == 0 and await self._gateway_idle(client):
                return True
            await asyncio.sleep(0.05)
        return False

    async def _gateway_idle(self, client: httpx.AsyncClient) -> bool:
        if not self.cfg.admin_url:
            return True
        hdr = {"authorization": f"Bearer {self.cfg.admin_token}"} if self.cfg.admin_token else {}
        try:
            resp = await client.get(f"{self.cfg.admin_url}/admin/status", headers=hdr)
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

    # -- one stream ------------------------------------------------------------------------------

    async def _stream(
        self,
        client: httpx.AsyncClient,
        st: _RunState,
        idx: int,
        temperature: float | None,
        run: int,
    ) -> None:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        short_left = cfg.warmup_requests
        seq = 0
        while not self.stop.is_set():
            if cfg.max_requests is not None and self.requests >= cfg.max_requests:
                self.request_stop(f"request bound reached ({cfg.max_requests} requests)")
                return
            long = short_left == 0
            msgs = prompts.messages(cfg.seed, st.n, temperature, run, idx, seq)
            body = prompts.chat_body(
                cfg.model,
                msgs,
                temperature=temperature,
                ignore_eos=cfg.ignore_eos,
                max_tokens=cfg.max_tokens if long else cfg.warmup_max_tokens,
            )
            seq += 1
            self.requests += 1
            st.requests += 1
            t0 = loop.time()
            chunks = 0
            last = t0
            seen: int | None = None  # completion tokens so far, from the chunks' usage
            failed = False
            try:
                async with client.stream(
                    "POST", f"{cfg.url}/v1/chat/completions", json=body, headers=self._headers()
                ) as resp:
                    if resp.status_code != 200:
                        text = (await resp.aread()).decode("utf-8", "replace")
                        st.error(f"HTTP {resp.status_code}: {text}")
                        failed = True
                    else:
                        if long:
                            variant = resp.headers.get("x-specrouter-variant")
                            if variant:
                                st.variants[variant] += 1
                            applied = resp.headers.get("x-specrouter-defaults")
                            if applied:
                                st.defaults[applied] += 1
                        buf = b""
                        async for raw in resp.aiter_bytes():
                            now = loop.time()
                            buf += raw
                            *frames, buf = buf.split(b"\n\n")
                            tokens = False
                            before = seen
                            for frame in frames:
                                kind = _frame_kind(frame)
                                if kind == "token":
                                    tokens = True
                                elif kind == "error":
                                    st.error(frame.decode("utf-8", "replace"))
                                    failed = True
                                seen = completion_tokens(frame) or seen
                            if not tokens:
                                continue
                            if chunks == 0 and long:
                                st.ttft.append(now - t0)
                            elif chunks > 0 and st.measuring:
                                st.gaps.append(now - last)
                                st.gap_tokens.append(
                                    seen - before if seen is not None and before is not None else 0
                                )
                            chunks += 1
                            last = now
                            if long and chunks == 2 and idx not in st.decoding:
                                st.decoding.add(idx)
                                if len(st.decoding) >= st.n:
                                    st.all_decoding.set()
            except asyncio.CancelledError:
                raise
            except httpx.HTTPError as exc:
                st.error(f"{type(exc).__name__}: {exc}")
                failed = True
            if failed:
                # Back off a little so a failing backend does not turn into a request storm.
                await asyncio.sleep(max(0.05, 0.5 * self.scale))
                continue
            if not long:
                short_left -= 1

    # -- one run ---------------------------------------------------------------------------------

    async def run_once(self, n: int, temperature: float | None, run: int, label: str) -> RunResult:
        cfg = self.cfg
        st = _RunState(n)
        limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
        timeout = httpx.Timeout(cfg.request_timeout_s, connect=10.0)
        started_at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        async with (
            httpx.AsyncClient(verify=cfg.verify, limits=limits, timeout=timeout) as client,
            httpx.AsyncClient(verify=cfg.verify, timeout=10.0) as mclient,
        ):
            tasks = [
                asyncio.create_task(self._stream(client, st, i, temperature, run)) for i in range(n)
            ]
            try:
                self.progress.line(
                    f"{label}: starting {n} stream(s)"
                    + (
                        f", {cfg.warmup_requests} warm-up request(s) each"
                        if cfg.warmup_requests
                        else ""
                    )
                )
                start_limit = max(30.0, (cfg.warmup_requests + 2) * 60.0 * self.scale)
                if not await self._wait_event(st.all_decoding, start_limit):
                    raise RuntimeError(
                        f"only {len(st.decoding)}/{n} streams decoding after {start_limit:.0f} s"
                        f" ({st.errors} errors: {'; '.join(st.error_samples[:2])})"
                    )
                await self._sleep(cfg.warmup_s * self.scale)
                t0, before = await self.read_counters(mclient, aligned=True)
                st.measuring = True
                end = t0 + cfg.window_s * self.scale
                while (left := end - time.monotonic()) > 0:
                    self.progress.live(
                        f"{label}: window, {left / self.scale:4.0f} s (unscaled) "
                        f"left, {self.time_left_text()}"
                    )
                    await self._sleep(min(left, 1.0))
                t1, after = await self.read_counters(mclient, aligned=True)
                st.measuring = False
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            if not await self.wait_idle(mclient):
                self.progress.line(f"{label}: warning: the engine did not go idle")
        window = (t1 - t0) / self.scale
        fig = window_figures(total(before.values()), total(after.values()), window)
        ttft = p50_p95([1000.0 * x / self.scale for x in st.ttft])
        itl = p50_p95(
            [
                1000.0 * x / self.scale
                for x in per_token(st.gaps, st.gap_tokens, fig.tokens_per_step)
            ]
        )
        gap = p50_p95([1000.0 * x / self.scale for x in st.gaps])
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

    # -- the prefill -----------------------------------------------------------------------------

    async def measure_prefill(self) -> PrefillResult:
        cfg = self.cfg
        nonce = uuid.uuid4().hex
        body: dict[str, Any] = {
            "model": cfg.model,
            "messages": prompts.long_prompt(cfg.prefill_tokens, nonce),
            "stream": True,
            "max_tokens": 1,
            "temperature": 0.7,
            "stream_options": {"include_usage": True},
        }
        timeout = httpx.Timeout(max(cfg.request_timeout_s, 600.0 * self.scale), connect=10.0)
        async with httpx.AsyncClient(verify=cfg.verify, timeout=timeout) as client:
            await self.wait_idle(client)
            _, before = await self.read_counters(client, aligned=False)
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            first: float | None = None
            usage: int | None = None
            async with client.stream(
                "POST", f"{cfg.url}/v1/chat/completions", json=body, headers=self._headers()
            ) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    raise RuntimeError(f"prefill request: HTTP {resp.status_code}: {text[:300]}")
                buf = b""
                async for raw in resp.aiter_bytes():
                    now = loop.time()
                    buf += raw
                    *frames, buf = buf.split(b"\n\n")
                    for frame in frames:
                        kind = _frame_kind(frame)
                        if kind == "token" and first is None:
                            first = now
                        elif kind == "error":
                            raise RuntimeError(f"prefill request: {frame[:300]!r}")
                        u = _usage_prompt_tokens(frame)
                        if u is not None:
                            usage = u
            if first is None:
                raise RuntimeError("prefill request: no token came back")
            await self.wait_idle(client)
            _, after = await self.read_counters(client, aligned=False)
        seconds = (first - t0) / self.scale
        counted = total(after.values()).get("prompt") - total(before.values()).get("prompt")
        if usage is not None:
            tokens, source = usage, "usage"
        elif counted > 0:
            tokens, source = int(counted), "counter"
        else:
            tokens, source = cfg.prefill_tokens, "estimate"
        return PrefillResult(tokens, seconds, tokens / seconds if seconds > 0 else math.nan, source)

    # -- the whole probe -------------------------------------------------------------------------

    def estimate_run_real_s(self, n: int) -> float:
        if self._run_seconds:
            return sum(self._run_seconds) / len(self._run_seconds)
        cfg = self.cfg
        unscaled = cfg.warmup_s + cfg.window_s + 3.0 + cfg.warmup_requests * 2.0
        return unscaled * self.scale + 0.5

    def time_left_text(self) -> str:
        left = self.remaining_estimate()
        return f"about {fmt_duration(left)} left"

    def remaining_estimate(self) -> float:
        plan = self.cfg.plan()
        done = len(self.results)
        left = sum(self.estimate_run_real_s(n) for n, _, _ in plan[done:])
        if self.cfg.prefill_tokens and self.prefill is None:
            left += 8.0 * self.scale + 1.0
        return left

    async def run(
        self,
        on_result: Callable[[RunResult], Awaitable[None] | None] | None = None,
        redo_if: Callable[[RunResult], str | None] | None = None,
        max_redos: int = 2,
    ) -> None:
        """Every planned run in order; stops cleanly on `request_stop` or a bound.

        `redo_if(result)` may give a reason to discard a run and measure it again (at most
        `max_redos` times per run); discarded runs are kept in `self.rejected`.
        """
        cfg = self.cfg
        plan = cfg.plan()
        self._t_start = time.monotonic()
        cells = [(n, t) for t in cfg.temperatures for n in cfg.concurrency]
        try:
            for i, (n, temp, r) in enumerate(plan):
                if cfg.max_seconds is not None:
                    spent = time.monotonic() - self._t_start
                    if spent + self.estimate_run_real_s(n) > cfg.max_seconds:
                        self.request_stop(f"time bound reached ({cfg.max_seconds:.0f} s)")
                        break
                cell_no = cells.index((n, temp)) + 1
                label = (
                    f"[cell {cell_no}/{len(cells)} N={n} temp={temp_label(temp)} "
                    f"run {r + 1}/{cfg.runs_for(n)} | run {i + 1}/{len(plan)}]"
                )
                self.progress.line(f"{label} {self.time_left_text()}")
                for attempt in range(max_redos + 1):
                    t_run = time.monotonic()
                    result = await self.run_once(n, temp, r, label)
                    self._run_seconds.append(time.monotonic() - t_run)
                    reason = redo_if(result) if redo_if is not None else None
                    if reason is None:
                        break
                    self.rejected.append((result, reason))
                    self.progress.line(
                        f"{label} discarded ({reason})"
                        + ("; measuring again" if attempt < max_redos else "")
                    )
                self.results.append(result)
                tps = (
                    ""
                    if result.tokens_per_step is None
                    else f", {result.tokens_per_step:.2f} tokens/step"
                )
                via = (
                    " via " + ", ".join(f"{k} x{v}" for k, v in sorted(result.variants.items()))
                    if result.variants
                    else ""
                )
                self.progress.line(
                    f"{label} -> {result.tok_s:.1f} tokens/s{tps}, {result.errors} error(s){via}"
                )
                if on_result is not None:
                    maybe = on_result(result)
                    if maybe is not None:
                        await maybe
            if cfg.prefill_tokens and not self.stop.is_set():
                self.progress.line(
                    f"[prefill] one fresh ~{cfg.prefill_tokens}-token prompt, "
                    f"{self.time_left_text()}"
                )
                self.prefill = await self.measure_prefill()
                self.progress.line(
                    f"[prefill] {self.prefill.prompt_tokens} prompt tokens in "
                    f"{self.prefill.seconds:.2f} s: "
                    f"{self.prefill.tok_s:.0f} tokens/s"
                )
        except Stopped:
            pass
        if self.stop.is_set():
            self.progress.line(
                f"stopped: {self.stop_reason}; keeping the {len(self.results)} complete run(s)"
            )
