"""The scheduler and the speculative model of one step (vLLM V1's scheduler, simplified).

No I/O and no clock of its own (callers pass `now`), so tests drive it step by step; `engine.py`
runs it on the event loop.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .device import Device
from .metrics import SimMetrics
from .prefix_cache import PrefixCache, chain
from .profiles import Profile
from .sequences import Delta, EngineRequest, Sequence, State
from .textgen import EOS_TOKEN_ID, piece_id, split_pieces, token_ids

_ACCEPT_CAP = 0.99  # no draft position is certain, whatever the multipliers say
# Newline runs by token id: a chat prompt ends with one ("<|im_start|>assistant\n"), and the
# stand-in tokenizer merges it with an answer's leading newlines when the next prompt holds both.
_NEWLINE_RUNS = {piece_id("\n" * k): "\n" * k for k in range(1, 9)}


def _order(seq: Sequence) -> tuple[int, float, int]:
    """vLLM's Request.__lt__ under priority scheduling: priority, then arrival (then a tie
    breaker of our own: the sequence's index)."""
    return (seq.request.priority, seq.request.arrival, seq.index)


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
        device: Device | None = None,
        kv_cache_tokens: int | None = None,
        scheduling_policy: str = "fcfs",
    ) -> None:
        self.profile = profile
        # vLLM's --scheduling-policy: `priority` serves the waiting queue by (priority, arrival)
        # and preempts the running sequence with the largest; `fcfs` ignores `priority`.
        self.by_priority = scheduling_policy == "priority"

        # Alone on a device of its own unless told otherwise (device.py has the model).
        self.device = device or Device()
        self.device.attach(self)
        self.kv_capacity = kv_cache_tokens or profile.kv_cache_tokens
        self.metrics = metrics
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.k = profile.num_spec_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.cache = PrefixCache(self.kv_capacity // profile.block_size)
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
                if seq.state is State.PREFILL and not seq.preempted:
                    self._keep_prefilled(seq)
                self.running.remove(seq)
                self.kv_used -= seq.kv_tokens
            seq.state = State.DONE
        req.wake()
        self._update_gauges()

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- one step ----------------------------------------------------------------------------

    def plan_step(self, now: float) -> StepPlan:
        self._preempt()
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
        duration += self.device.context_seconds(s.kv_tokens for s in decode)
        return StepPlan(decode, prefill, duration * self.device.slowdown(self))

    def complete_step(self, plan: StepPlan, now: float) -> None:
        self.steps += 1
        batch = len(plan.decode)
        # vLLM picks K from the step's scheduled requests (its batch-size schedule, if any)
        k = self.profile.draft_tokens(batch + len(plan.prefill))
        for seq in plan.decode:
            if seq.state is State.DECODE:
                self._decode(seq, batch, now, k)
        for seq, n in plan.prefill:
            if seq.state is not State.PREFILL:
                continue
            seq.prefill_left -= n
            if seq.prefill_left <= 0:
                if seq.preempted:
                    self._resume(seq)
                else:
                    self._first_token(seq, now)
        self._update_gauges()

    # -- internals ---------------------------------------------------------------------------

    def _preempt(self) -> None:
        """Running sequences outgrew the cache: the last admitted (with priority scheduling,
        the largest (priority, arrival), as vllm/v1/core/sched/scheduler.py picks it) goes back
        to the queue and frees its KV, to be recomputed (vLLM's recompute preemption)."""
        while self.kv_used > self.kv_capacity and len(self.running) > 1:
            if self.by_priority:
                seq = max(self.running, key=_order)
                self.running.remove(seq)
            else:
                seq = self.running.pop()
            self.kv_used -= seq.kv_tokens
            seq.state = State.WAITING
            seq.preempted = True
            seq.in_cache = 0
            self.waiting.appendleft(seq)
            self.metrics.preemptions.inc()

    def _admit(self, now: float) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs:
            # vLLM's waiting queue: first come first served, or a heap by (priority, arrival)
            seq = min(self.waiting, key=_order) if self.by_priority else self.waiting[0]
            req = seq.request
            # A preempted sequence needs its generated tokens back too.
            need = seq.kv_tokens
            if self.running and self.kv_used + need > self.kv_capacity:
                break  # no room: wait for a sequence to finish
            if seq is self.waiting[0]:
                self.waiting.popleft()
            else:
                self.waiting.remove(seq)
            hit_blocks = self.cache.match(req.block_hashes)
            # vLLM always recomputes the last prompt token to get logits.
            cached = min(hit_blocks * self.profile.block_size, req.prompt_len - 1)
            cached = max(cached, 0)
            if seq.index == 0 and not seq.preempted:
                req.cached_tokens = cached
            self.metrics.prefix_queries.inc(req.prompt_len)
            self.metrics.prefix_hits.inc(cached)
            seq.prefill_left = max(1, need - cached)
            seq.in_cache = cached
            seq.state = State.PREFILL
            self.running.append(seq)
            self.kv_used += need
            if not seq.preempted:
                seq.scheduled_t = now
                self.metrics.queue_time.observe(now - req.arrival)

    def _keep_prefilled(self, seq: Sequence) -> None:
        """An aborted prefill leaves its computed full blocks in the prefix cache, as vLLM's do:
        `KVCacheManager.allocate_slots` caches every full block of a chunk when it schedules it
        (up to the computed tokens, vllm/v1/core/kv_cache_manager.py) and `free` only returns
        the blocks to the pool, still hashed, tail first to be evicted. So a resend of the same
        prompt finds what the abandoned copy prefilled (the chunks whose step has ended here)."""
        done = seq.kv_tokens - seq.prefill_left
        blocks = seq.request.block_hashes[: max(0, done) // self.profile.block_size]
        self.cache.insert(blocks, session=seq.request.session, tail_first=True)

    def _resume(self, seq: Sequence) -> None:
        """A preempted sequence has recomputed its KV: it decodes on, its output untouched."""
        self.cache.insert(seq.request.block_hashes, session=seq.request.session)
        seq.in_cache = seq.request.prompt_len
        seq.state = State.DECODE

    def _first_token(self, seq: Sequence, now: float) -> None:
        req = seq.request
        self.cache.insert(req.block_hashes, session=req.session)
        seq.in_cache = req.prompt_len
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

    def _decode(self, seq: Sequence, batch: int, now: float, k: int) -> None:
        accepted = 0
        if k:
            rnd = seq.rng.random
            for c in self._conditionals(batch, seq.factor)[:k]:
                if rnd() >= c:
                    break
                accepted += 1
            seq.spec.record(accepted, k)
            m = self.metrics
            m.spec_drafts.inc()
            m.spec_draft_tokens.inc(k)
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
        if seq.pieces is not None:
            seq.pieces.extend(pieces)
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
            self._cache_output(seq, eos)
            self._finish(seq, finish, now)

    def _cache_output(self, seq: Sequence, eos: bool) -> None:
        """The full blocks decoding filled join the prefix cache, as vLLM hashes every full
        block of a request, so the next turn (whose prompt holds this answer) hits them.

        vLLM hashes the generated ids, which its tokenizer gives back when the answer is sent
        again; the stand-in tokenizer merges newline runs across pieces, so the output is hashed
        as the next prompt will split it: the prompt's last newline run, the answer, and the
        end-of-turn marker (the template writes `<|im_end|>` where EOS was generated)."""
        req = seq.request
        if seq.pieces is None or req.tail_ids is None:
            return
        tail = list(req.tail_ids)
        lead = _NEWLINE_RUNS.get(tail[-1], "") if tail else ""
        if lead:
            tail.pop()
        text = lead + "".join(seq.pieces) + ("<|im_end|>" if eos else "")
        prev = req.block_hashes[-1] if req.block_hashes else 0
        self.cache.insert(
            chain(tail + token_ids(split_pieces(text)), self.profile.block_size, prev),
            parent=prev if req.block_hashes else None,
            session=req.session,
        )
        seq.pieces = None

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
        # Every block is either a prefix-cache entry (free or shared by the running sequences
        # that hit it) or held by one running sequence alone: what those hold is not the cache's.
        own = sum(max(0, s.kv_tokens - s.in_cache) for s in self.running)
        self.cache.resize(
            self.kv_capacity // self.profile.block_size - -(-own // self.profile.block_size)
        )
        m = self.metrics
        m.running.set(len(self.running))
        m.waiting.set(len(self.waiting))
        m.kv_usage.set(min(1.0, self.kv_used / self.kv_capacity))
