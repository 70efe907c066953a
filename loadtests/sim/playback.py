"""Played-back engine outputs, for byte-for-byte comparisons with vLLM's own bytes (tests only).

A `Playback` replaces the model of one simulated server: every request gets the given prompt token
ids (its prompt count) and, instead of generated text, the given engine outputs, one consumer
read per output, as vLLM's frontend yields one `RequestOutput` per engine step. Everything
after the engine (validation, chunk building, usage, framing) is the simulator's own code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .sequences import Delta, EngineRequest, SpecStats


@dataclass(frozen=True, slots=True)
class Playback:
    prompt_token_ids: list[int]
    steps: list[list[Delta]]  # one engine output per entry: the new output of each sequence
    cached_tokens: int = 0
    spec: SpecStats | None = None  # the recorded per-request speculative counters, if any
    _tasks: set[asyncio.Task[None]] = field(default_factory=set, repr=False, compare=False)

    def play(self, req: EngineRequest) -> None:
        req.cached_tokens = self.cached_tokens
        task = asyncio.get_running_loop().create_task(self._play(req))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _play(self, req: EngineRequest) -> None:
        for step in self.steps:
            for d in step:
                req.push(Delta(d.index, d.text, list(d.token_ids), d.finish_reason, d.stop_reason))
                if d.finish_reason is not None:
                    req.finished += 1
            while req.due and not req.aborted:
                await asyncio.sleep(0)
            if req.aborted:
                return
        req.finished = req.n
        req.wake()
