"""Continuous batching with speculative decoding: one loop advances every running sequence.

`EngineCore` is the model and has no I/O and no clock of its own (callers pass `now`), so it can be
driven step by step in tests. `Engine` runs it on the event loop: plan a step, sleep for the step's
(scaled) duration, apply it, and hand each sequence's new tokens to its request.

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
import math
import random
from collections import OrderedDict, deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum

from .metrics import SimMetrics
from .profiles import Profile
from .textgen import EOS_TOKEN_ID, CodeText, derive_seed, token_ids

logger = logging.getLogger("specrouter.sim")

_ACCEPT_CAP = 0.99  # no draft position is certain, whatever the multipliers say


class State(Enum):
    WAITING = 0
    PREFILL = 1
    DECODE = 2
    DONE = 3


@dataclass(frozen=True, slots=True)
class SamplingSpec:
    max_tokens: int
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    include_stop_str: bool = False
    ignore_eos: bool = False
    temperature: float = 1.0


@dataclass(slots=True)
class Delta:
    """New output of one sequence since its consumer last looked (several steps merge)."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | None = None


@dataclass(slots=True)
class SpecStats:
    """Per-sequence speculative counters (vLLM's RequestSpecDecodeMetrics)."""

    num_spec_tokens: int
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    histogram: list[int] = field(default_factory=list)

    def record(self, accepted: int) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.num_spec_tokens + 1)
        self.steps += 1
        self.drafted += self.num_spec_tokens
        self.accepted += accepted
        self.histogram[accepted] += 1


class Sequence:
    """One generated choice of a request."""

    __slots__ = (
        "request",
        "index",
        "state",
        "text",
        "rng",
        "factor",
        "eos_at",
        "prefill_left",
        "num_generated",
        "out_text",
        "emitted",
        "spec",
        "scheduled_t",
        "first_token_t",
        "last_token_t",
        "finish_reason",
        "kv_tokens",
    )

    def __init__(self, request: EngineRequest, index: int, profile: Profile) -> None:
        key = request.key
        self.request = request
        self.index = index
        self.state = State.WAITING
        self.text = CodeText(derive_seed(key, index, "text"))
        self.rng = random.Random(derive_seed(key, index, "accept"))
        sp = request.sampling
        # Content variance: how well the drafter guesses depends on what is being written.
        sigma = profile.content_sigma(sp.temperature)
        z = random.Random(derive_seed(key, index, "content")).gauss(0.0, 1.0)
        self.factor = profile.temperature_factor(sp.temperature) * math.exp(
            sigma * z - sigma * sigma / 2.0
        )
        # Natural answer length: log-normal, median 400 tokens (mean ~460, as in the facts).
        length = random.Random(derive_seed(key, index, "length")).lognormvariate(
            math.log(400.0), 0.6
        )
        self.eos_at: int | None = None if sp.ignore_eos else max(8, sp.min_tokens, round(length))
        self.prefill_left = 0
        self.num_generated = 0
        self.out_text = ""  # kept only while stop strings need a look-back
        self.emitted = 0
        self.spec = SpecStats(profile.num_spec_tokens)
        self.scheduled_t = 0.0
        self.first_token_t = 0.0
        self.last_token_t = 0.0
        self.finish_reason: str | None = None
        self.kv_tokens = request.prompt_len


class EngineRequest:
    """A request in the engine: n sequences sharing a prompt, and the queue its consumer reads."""

    def __init__(
        self,
        request_id: str,
        *,
        prompt_len: int,
        block_hashes: Seq[int],
        sampling: SamplingSpec,
        n: int,
        key: int,
        arrival: float,
    ) -> None:
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.block_hashes = list(block_hashes)
        self.sampling = sampling
        self.n = n
        self.key = key
        self.arrival = arrival
        self.sequences: list[Sequence] = []
        self.cached_tokens = 0
        self.aborted = False
        self.finished = 0
        self._pending: dict[int, Delta] = {}
        self._event = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.aborted or self.finished == self.n

    def push(self, delta: Delta) -> None:
        """Queue output; merged with what the consumer has not taken yet (vLLM's collector)."""
        prev = self._pending.get(delta.index)
        if prev is None:
            self._pending[delta.index] = delta
        else:
            prev.text += delta.text
            prev.token_ids.extend(delta.token_ids)
            prev.finish_reason = delta.finish_reason
            prev.stop_reason = delta.stop_reason
        self._event.set()

    def wake(self) -> None:
        self._event.set()

    async def take(self) -> list[Delta]:
        """Wait for output. An empty list means the request is over (finished or aborted)."""
        while not self._pending:
            if self.done:
                return []
            self._event.clear()
            await self._event.wait()
        if self.aborted:
            return []
        out = list(self._pending.values())
        self._pending = {}
        return out


class PrefixCache:
    """LRU of computed KV blocks, by chained block hash."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def match(self, hashes: Seq[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(self, hashes: Seq[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


@dataclass(slots=True)
class StepPlan:
    decode: list[Sequence]
    prefill: list[tuple[Sequence, int]]
    duration: float  # unscaled seconds


class EngineCore:
    """The scheduler and the speculative model; no I/O, no clock of its own."""

    def __init__(
        self,
        profile: Profile,
        metrics: SimMetrics,
        *,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 8192,
    ) -> None:
        self.profile = profile
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.k = profile.num_spec_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache = PrefixCache(profile.kv_cache_tokens // profile.block_size)
        self.accept_factor = 1.0  # acceptance_collapse fault
        self.kv_used = 0
        self.steps = 0
        self._marginals_batch = -1
        self._marginals: tuple[float, ...] = ()

    # -- requests ----------------------------------------------------------------------------

    def add(self, req: EngineRequest) -> None:
        for i in range(req.n):
            seq = Sequence(req, i, self.profile)
            req.sequences.append(seq)
            self.waiting.append(seq)
        self.metrics.request_n.observe(req.n)
        self.metrics.request_max_tokens.observe(req.sampling.max_tokens)
        self._update_gauges()

    def abort(self, req: EngineRequest) -> None:
        """Drop a request's sequences and free their slots (client went away)."""
        if req.done:
            return
        req.aborted = True
        for seq in req.sequences:
            if seq.state is State.WAITING:
                self.waiting.remove(seq)
            elif seq.state is not State.DONE:
                self.running.remove(seq)
                self.kv_used -= seq.kv_tokens
            seq.state = State.DONE
        req.wake()
        self._update_gauges()

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- one step ----------------------------------------------------------------------------

    def plan_step(self, now: float) -> StepPlan:
        self._admit(now)
        decode = [s for s in self.running if s.state is State.DECODE]
        budget = self.max_num_batched_tokens - len(decode) * (1 + self.k)
        prefill: list[tuple[Sequence, int]] = []
        prefill_tokens = 0
        for seq in self.running:
            if seq.state is State.PREFILL and budget > 0:
                n = min(seq.prefill_left, budget)
                budget -= n
                prefill_tokens += n
                prefill.append((seq, n))
        duration = self.profile.step_seconds(len(decode) + len(prefill))
        duration += prefill_tokens / self.profile.prefill_tokens_per_s
        return StepPlan(decode, prefill, duration)

    def complete_step(self, plan: StepPlan, now: float) -> None:
        self.steps += 1
        batch = len(plan.decode)
        for seq in plan.decode:
            if seq.state is State.DECODE:
                self._decode(seq, batch, now)
        for seq, n in plan.prefill:
            if seq.state is not State.PREFILL:
                continue
            seq.prefill_left -= n
            if seq.prefill_left <= 0:
                self._first_token(seq, now)
        self._update_gauges()

    # -- internals ---------------------------------------------------------------------------

    def _admit(self, now: float) -> None:
        capacity = self.profile.kv_cache_tokens
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            req = seq.request
            if self.running and self.kv_used + req.prompt_len > capacity:
                break  # no room: wait for a sequence to finish (no preemption modelled)
            self.waiting.popleft()
            hit_blocks = self.cache.match(req.block_hashes)
            # vLLM always recomputes the last prompt token to get logits.
            cached = min(hit_blocks * self.profile.block_size, req.prompt_len - 1)
            cached = max(cached, 0)
            if seq.index == 0:
                req.cached_tokens = cached
            self.metrics.prefix_queries.inc(req.prompt_len)
            self.metrics.prefix_hits.inc(cached)
            seq.prefill_left = max(1, req.prompt_len - cached)
            seq.state = State.PREFILL
            seq.scheduled_t = now
            self.running.append(seq)
            self.kv_used += seq.kv_tokens
            self.metrics.queue_time.observe(now - req.arrival)

    def _first_token(self, seq: Sequence, now: float) -> None:
        req = seq.request
        self.cache.insert(req.block_hashes)
        m = self.metrics
        m.prompt_tokens.inc(req.prompt_len)
        m.request_prompt_tokens.observe(req.prompt_len)
        m.ttft.observe(now - req.arrival)
        seq.first_token_t = now
        seq.last_token_t = now
        seq.state = State.DECODE
        self._emit(seq, 1, now)

    def _conditionals(self, batch: int, factor: float) -> list[float]:
        if batch != self._marginals_batch:
            self._marginals = self.profile.marginals(batch)
            self._marginals_batch = batch
        f = factor * self.accept_factor
        out: list[float] = []
        prev = 1.0
        for m in self._marginals:
            cur = min(_ACCEPT_CAP, m * f)
            out.append(cur / prev if prev > 0.0 else 0.0)
            prev = cur
        return out

    def _decode(self, seq: Sequence, batch: int, now: float) -> None:
        accepted = 0
        if self.k:
            rnd = seq.rng.random
            for c in self._conditionals(batch, seq.factor):
                if rnd() >= c:
                    break
                accepted += 1
            seq.spec.record(accepted)
            m = self.metrics
            m.spec_drafts.inc()
            m.spec_draft_tokens.inc(self.k)
            if accepted:
                m.spec_accepted.inc(accepted)
                for pos in range(accepted):
                    m.spec_per_pos[pos].inc()
        # One ITL sample per engine step, whatever the step yielded (vLLM semantics).
        self.metrics.itl.observe(now - seq.last_token_t)
        seq.last_token_t = now
        self._emit(seq, 1 + accepted, now)

    def _emit(self, seq: Sequence, n: int, now: float) -> None:
        """Generate up to n tokens for seq, apply stop conditions, hand them to the request."""
        req = seq.request
        sp = req.sampling
        take = min(n, sp.max_tokens - seq.num_generated)
        finish: str | None = None
        stop_reason: str | None = None
        eos = False
        if seq.eos_at is not None and seq.num_generated + take >= seq.eos_at:
            take = seq.eos_at - seq.num_generated
            eos = True
            finish = "stop"
        elif seq.num_generated + take >= sp.max_tokens:
            finish = "length"
        pieces = seq.text.next_pieces(take - 1 if eos else take)
        ids = token_ids(pieces)
        if eos:
            ids.append(EOS_TOKEN_ID)
        seq.num_generated += take
        seq.kv_tokens += take
        self.kv_used += take
        self.metrics.generation_tokens.inc(take)
        new_text = "".join(pieces)

        if sp.stop and seq.num_generated > sp.min_tokens:
            text, stop_reason = self._apply_stop(seq, new_text, finish is not None)
            if stop_reason is not None:
                finish = "stop"
        elif sp.stop:
            seq.out_text += new_text
            text = self._release(seq, final=finish is not None)
        else:
            text = new_text
        req.push(Delta(seq.index, text, ids, finish, stop_reason))
        if finish is not None:
            self._finish(seq, finish, now)

    def _apply_stop(self, seq: Sequence, new_text: str, final: bool) -> tuple[str, str | None]:
        sp = seq.request.sampling
        start = max(0, len(seq.out_text) - max(len(s) for s in sp.stop) + 1)
        seq.out_text += new_text
        hit: tuple[int, str] | None = None
        for s in sp.stop:
            i = seq.out_text.find(s, start)
            if i >= 0 and (hit is None or i < hit[0]):
                hit = (i, s)
        if hit is not None:
            i, s = hit
            seq.out_text = seq.out_text[: i + len(s) if sp.include_stop_str else i]
            return self._release(seq, final=True), s
        return self._release(seq, final=final), None

    def _release(self, seq: Sequence, *, final: bool) -> str:
        """Text safe to send: hold back what could still become a stop string (vLLM does too)."""
        sp = seq.request.sampling
        end = len(seq.out_text)
        if not final and not sp.include_stop_str:
            end = max(seq.emitted, end - (max(len(s) for s in sp.stop) - 1))
        text = seq.out_text[seq.emitted : end]
        seq.emitted = end
        return text

    def _finish(self, seq: Sequence, reason: str, now: float) -> None:
        req = seq.request
        seq.state = State.DONE
        seq.finish_reason = reason
        self.running.remove(seq)
        self.kv_used -= seq.kv_tokens
        req.finished += 1
        m = self.metrics
        m.success[reason].inc()
        m.e2e.observe(now - req.arrival)
        m.inference_time.observe(now - seq.scheduled_t)
        m.prefill_time.observe(seq.first_token_t - seq.scheduled_t)
        m.decode_time.observe(now - seq.first_token_t)
        m.request_generation_tokens.observe(seq.num_generated)
        if seq.num_generated > 1:
            m.tpot.observe((now - seq.first_token_t) / (seq.num_generated - 1))
        if req.done:
            req.wake()

    def _update_gauges(self) -> None:
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.kv_usage.set(min(1.0, self.kv_used / self.profile.kv_cache_tokens))


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
