"""The probe's measurement loop: N concurrent code-generation streams, a counter window, a prefill.

One *run* of a cell (N streams, one temperature):

1. open N streams (closed loop: a stream whose request ends opens the next one). With
   `warmup_requests` > 0 each stream first sends that many short requests, so that a gateway's
   load rule sees the steady concurrency before the measured requests are routed. Through a
   gateway whose admin API is given, the last warm-up request is held open instead, and the
   streams hand over one at a time: each closes its warm-up, waits until the gateway counts
   the other N-1 only, and sends its long request, routed at exactly N in flight (short
   warm-ups alone leave that to timing: on a loaded machine the client turned round after
   the gateway had finished every short one, and the long requests arrived together);
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
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from loadtests.probe import prompts
from loadtests.probe.config import MetricsSource, PrefillResult, ProbeConfig, RunResult
from loadtests.probe.frames import _frame_kind, _usage_prompt_tokens, completion_tokens
from loadtests.probe.progress import Progress, fmt_duration
from loadtests.probe.stats import temp_label
from loadtests.probe.window import (
    RunState,
    gateway_in_flight_at_most,
    prefill_result,
    read_counters,
    result_line,
    run_result,
    wait_idle,
)

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

    # -- one stream ------------------------------------------------------------------------------

    async def _stream(
        self,
        client: httpx.AsyncClient,
        st: RunState,
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
            held = short_left == 1 and bool(cfg.admin_url)  # held open, then handed over
            msgs = prompts.messages(cfg.seed, st.n, temperature, run, idx, seq)
            body = prompts.chat_body(
                cfg.model,
                msgs,
                temperature=temperature,
                ignore_eos=cfg.ignore_eos,
                max_tokens=cfg.max_tokens if long or held else cfg.warmup_max_tokens,
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
                        if long and cfg.admin_url and idx + 1 < st.n:
                            st.turns[idx + 1].set()  # routed and counted: the next one's turn
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
                            if held and idx not in st.holding:
                                st.holding.add(idx)
                                if len(st.holding) >= st.n:
                                    st.turns[0].set()
                            if held and st.turns[idx].is_set():
                                break  # closed here: the gateway sees this stream leave
            except asyncio.CancelledError:
                raise
            except httpx.HTTPError as exc:
                st.error(f"{type(exc).__name__}: {exc}")
                failed = True
            if failed:
                # Back off a little so a failing backend does not turn into a request storm.
                await asyncio.sleep(max(0.05, 0.5 * self.scale))
                continue
            if held:
                limit = max(30.0, 120.0 * self.scale)
                await self._wait_event(st.turns[idx], limit)
                await gateway_in_flight_at_most(client, cfg, st.n - 1, limit)
            if not long:
                short_left -= 1

    # -- one run ---------------------------------------------------------------------------------

    async def run_once(self, n: int, temperature: float | None, run: int, label: str) -> RunResult:
        cfg = self.cfg
        st = RunState(n)
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
                t0, before = await read_counters(mclient, cfg.sources, aligned=True)
                st.measuring = True
                end = t0 + cfg.window_s * self.scale
                while (left := end - time.monotonic()) > 0:
                    self.progress.live(
                        f"{label}: window, {left / self.scale:4.0f} s (unscaled) "
                        f"left, {self.time_left_text()}"
                    )
                    await self._sleep(min(left, 1.0))
                t1, after = await read_counters(mclient, cfg.sources, aligned=True)
                st.measuring = False
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            await client.aclose()
            if not await wait_idle(mclient, cfg):
                self.progress.line(f"{label}: warning: the engine did not go idle")
        window = (t1 - t0) / self.scale
        return run_result(
            st, temperature, run, window, before, after, scale=self.scale, started_at=started_at
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
            await wait_idle(client, cfg)
            _, before = await read_counters(client, cfg.sources, aligned=False)
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
            await wait_idle(client, cfg)
            _, after = await read_counters(client, cfg.sources, aligned=False)
        seconds = (first - t0) / self.scale
        return prefill_result(usage, before, after, seconds, cfg.prefill_tokens)

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
                self.progress.line(f"{label} {result_line(result)}")
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
