"""A request in the engine and its sequences: sampling parameters, per-step output, counters.

`EngineRequest` is also the queue between the engine and the handler that streams it: output the
consumer has not taken yet is merged, as vLLM's `RequestOutputCollector` does.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from enum import Enum

from .profiles import Profile
from .textgen import CodeText, derive_seed


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


@dataclass(frozen=True, slots=True)
class Script:
    """Scripted model output: token pieces, and whether the answer ends with them."""

    pieces: tuple[str, ...]
    complete: bool


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

    def record(self, accepted: int, drafted: int | None = None) -> None:
        if not self.histogram:
            self.histogram = [0] * (self.num_spec_tokens + 1)
        self.steps += 1
        self.drafted += self.num_spec_tokens if drafted is None else drafted
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
        "in_cache",
        "preempted",
        "pieces",
    )

    def __init__(self, request: EngineRequest, index: int, profile: Profile) -> None:
        key = request.key
        self.request = request
        self.index = index
        self.state = State.WAITING
        script = request.script
        self.text = CodeText(derive_seed(key, index, "text"), script.pieces if script else ())
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
        natural = max(8, sp.min_tokens, round(length))
        if script is not None:
            # A scripted answer ends with its last piece (then EOS); a scripted prefix is
            # followed by the usual free text.
            natural = len(script.pieces) + 1 if script.complete else natural + len(script.pieces)
        self.eos_at: int | None = None if sp.ignore_eos else natural
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
        self.in_cache = 0  # of its KV tokens, those that are prefix-cache blocks
        self.preempted = False  # once preempted, it recomputes instead of starting afresh
        # Its generated pieces, kept to hash the blocks decoding fills (core._cache_output).
        self.pieces: list[str] | None = None if request.tail_ids is None else []


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
        script: Script | None = None,
        tail_ids: Seq[int] | None = None,
        priority: int = 0,
        session: str | None = None,
    ) -> None:
        self.request_id = request_id
        # the session id its KV blocks are tagged with (vLLM 0.30.0 on: kv_publisher.py)
        self.session = session
        self.priority = priority  # vLLM's `priority` field: lower first (priority scheduling)
        self.prompt_len = prompt_len
        self.block_hashes = list(block_hashes)
        self.sampling = sampling
        self.n = n
        self.key = key
        self.arrival = arrival
        self.script = script
        # The prompt's tokens after its last full block: the output's blocks chain on from them
        # (None: not known, the output is not cached).
        self.tail_ids = None if tail_ids is None else list(tail_ids)
        self.sequences: list[Sequence] = []
        self.cached_tokens = 0
        self.aborted = False
        self.finished = 0
        self._pending: dict[int, Delta] = {}
        self._event = asyncio.Event()
        # vLLM's stream_interval (server --stream-interval or the request's field): after the
        # first output, the consumer gets output once a sequence has this many new tokens, or
        # at its finish.
        self.stream_interval = 1
        self._sent = False

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
        if self.due:
            self._event.set()

    def wake(self) -> None:
        self._event.set()

    @property
    def pending(self) -> bool:
        """Output is waiting for the consumer."""
        return bool(self._pending)

    @property
    def due(self) -> bool:
        """Waiting output is to be sent now (stream_interval reached, first output, finish)."""
        if not self._pending:
            return False
        if self.stream_interval <= 1 or not self._sent:
            return True
        return any(
            d.finish_reason is not None or len(d.token_ids) >= self.stream_interval
            for d in self._pending.values()
        )

    async def take(self) -> list[Delta]:
        """Wait for output. An empty list means the request is over (finished or aborted)."""
        while not self.due:
            if self.done and not self._pending or self.aborted:
                return []
            self._event.clear()
            await self._event.wait()
        if self.aborted:
            return []
        out = list(self._pending.values())
        self._pending = {}
        self._sent = True
        return out
