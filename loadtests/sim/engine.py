"""Continuous batching with speculative decoding: one loop advances every running sequence.

`EngineCore` (core.py) is the model and has no I/O and no clock of its own (callers pass `now`),
so it can be driven step by step in tests; requests and sequences are in sequences.py, the prefix
cache in prefix_cache.py. `Engine` runs the core on the event loop: plan a step, sleep for the
step's (scaled) duration, apply it, and hand each sequence's new tokens to its request.

What one step does, as in vLLM's V1 scheduler:
* waiting requests are admitted FIFO while fewer than `max_num_seqs` run and the KV cache has
  room; their prompt is looked up in the prefix cache (16-token blocks, chained hashes);
* prefill is chunked: prompt tokens not in the cache are processed within the step's token budget
  at the profile's prefill rate, and the step that finishes a prompt yields its first token;
* every decoding sequence drafts k tokens; acceptance is a prefix (position j only if j-1 was
  accepted) and the step yields 1 + accepted tokens, truncated by max_tokens, EOS or a stop string.
  The spec counters count drafts before truncation, as vLLM's scheduler does;
* the step's duration is the profile's step time at the batch size plus the prefill work.
"""

from __future__ import annotations

import asyncio
import logging

from .core import EngineCore, StepPlan
from .prefix_cache import PrefixCache
from .sequences import Delta, EngineRequest, SamplingSpec, Sequence, SpecStats, State

__all__ = [
    "Delta",
    "Engine",
    "EngineCore",
    "EngineRequest",
    "PrefixCache",
    "SamplingSpec",
    "Sequence",
    "SpecStats",
    "State",
    "StepPlan",
]

logger = logging.getLogger("specrouter.sim")


class Engine:
    """Runs an EngineCore on the event loop, one step after another, in scaled time."""

    # If the loop falls this far behind its schedule (CPU starvation, a debugger), it stops
    # trying to catch up rather than firing a burst of zero-length steps.
    MAX_LAG_S = 0.05

    def __init__(self, core: EngineCore, *, time_scale: float) -> None:
        self.core = core
        self.time_scale = time_scale
        self._work = asyncio.Event()
        self._running = asyncio.Event()
        self._running.set()
        self._task: asyncio.Task[None] | None = None
        self.dead = False

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def submit(self, req: EngineRequest) -> None:
        self.core.add(req)
        self._work.set()

    def abort(self, req: EngineRequest) -> None:
        self.core.abort(req)

    def pause(self) -> None:
        """Stop stepping (the `hang` fault): streams stay open and silent."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def wait_unpaused(self) -> None:
        await self._running.wait()

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            # A bug here must not leave every stream hanging: the engine is dead, as a crashed
            # vLLM engine core is (/health answers 503), and its requests end.
            logger.exception("simulated engine loop failed")
            self.dead = True
            for seq in [*self.core.running, *self.core.waiting]:
                self.core.abort(seq.request)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        core = self.core
        next_t = loop.time()
        while True:
            if not self._running.is_set():
                await self._running.wait()
                next_t = loop.time()
                continue
            if not core.has_work():
                self._work.clear()
                await self._work.wait()
                next_t = loop.time()
                continue
            now = loop.time()
            plan = core.plan_step(now)
            # Deadlines are absolute, so timer granularity does not accumulate into drift.
            next_t = max(next_t, now - self.MAX_LAG_S) + plan.duration * self.time_scale
            # Always yield, even when late: consumers take each step's output before the next
            # one, so a chunk is one engine step (vLLM merges only when its frontend lags).
            await asyncio.sleep(max(0.0, next_t - loop.time()))
            core.complete_step(plan, loop.time())
