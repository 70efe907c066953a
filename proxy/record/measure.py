"""Per-request measurement: what one request did, as the gateway saw it, and what it gives.

The relay's stream filter (proxy/relay/measure.py) fills it from each relayed frame; it does no
I/O and reads no clock: the relay passes `now` in.

One meaning of each measure, for every API (docs/metrics.md says the same):
- TTFT: streams only, arrival of the request to the relay of the first frame that carries a
  generated token (text, reasoning, tool-call arguments); a role-only chunk, `response.created`,
  `message_start`, pings and comments are not tokens. A non-streaming request has its e2e only.
- ITL: per token. A decode chunk of n tokens after a gap g gives n tokens of g/n; where the
  engine sends no per-event counts (Responses, Messages) it is the request average.
- tokens per step: (completion tokens - 1) / decode steps (proxy/record/steps.py); `TpsSource`
  says where the decode steps come from.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.bounds import token_count
from proxy.record.steps import StepCount, decode_steps, estimate_steps

# Where a request's decode steps come from (tokens per step is always (completion tokens - 1) /
# decode steps, proxy/record/steps.py): "engine", vLLM's per-request
# `metrics.speculative_decoding` or llama.cpp's `timings` (with the chunk count as a floor);
# "chunks", one step per decode chunk; "average", one step per token event after the first, on
# streams without per-event usage (Responses, Messages).
TpsSource = Literal["engine", "chunks", "average"]
TPS_SOURCES: tuple[TpsSource, ...] = ("engine", "chunks", "average")


@dataclass(slots=True)
class Measurement:
    """What one request did, as the gateway saw it. Times are monotonic seconds."""

    t_start: float
    stream: bool = False  # an event stream was relayed: only then is there a TTFT
    t_engine: float | None = None  # the answering engine was asked
    t_headers: float | None = None  # its response headers came
    t_first_byte: float | None = None  # first frame sent to the client
    t_first_token: float | None = None  # first frame carrying a generated token, relayed
    t_last_token: float | None = None
    t_end: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    response_id: str | None = None  # a Responses answer's id (proxy/backends/response_owners.py)
    completion_tokens: int = 0
    chunks: int = 0  # choice frames seen
    delta_events: int = 0  # token-carrying events of a stream without per-event usage
    # Per decode chunk, as typed arrays: 12 bytes a chunk instead of ~40 (a float object and two
    # list slots); `gw.recent` keeps 200 finished requests with theirs.
    step_gaps: array[float] = field(default_factory=lambda: array("d"))
    step_tokens: array[int] = field(default_factory=lambda: array("I"))
    spec: dict[str, Any] | None = None  # vLLM's metrics.speculative_decoding, when reported
    # Most tokens one engine step can give (num_speculative_tokens + 1), when the policy says.
    max_step_tokens: int | None = None
    # Why a chunk count cannot be tokens per step ("stream_interval", "merged", "tool_calls": a
    # parser's buffer; "token_frames": llama.cpp's one frame per token): the gateway's estimate
    # is then withheld, and only the engine's own figure is reported.
    estimate_void: str | None = None
    finish_reason: str | None = None
    error: str | None = None  # an upstream error event's message

    @property
    def ttft(self) -> float | None:
        if not self.stream or self.t_first_token is None:
            return None
        return self.t_first_token - self.t_start

    @property
    def e2e(self) -> float | None:
        return None if self.t_end is None else self.t_end - self.t_start

    @property
    def tps_source(self) -> TpsSource | None:
        counted = self._counted()
        return None if counted is None else counted[0]

    @property
    def acceptance(self) -> float | None:
        """Tokens per target step, (completion tokens - 1) / decode steps
        (proxy/record/steps.py), from `tps_source`."""
        counted = self._counted()
        return None if counted is None else counted[1].per_step

    @property
    def step_count(self) -> StepCount | None:
        """(tokens after the first, decode steps), to pool tokens per step over requests."""
        counted = self._counted()
        return None if counted is None else counted[1]

    @property
    def accepted_and_steps(self) -> tuple[int, int] | None:
        """(accepted draft tokens that reached the answer, decode steps)."""
        count = self.step_count
        return None if count is None else (count.accepted, count.steps)

    def _counted(self) -> tuple[TpsSource, StepCount] | None:
        n, limit = self.completion_tokens, self._max_step_tokens()
        chunks = len(self.step_tokens) if self.estimate_void != "token_frames" else None
        engine = self._engine_counts()
        if engine is not None:
            accepted, drafted = engine
            if not chunks and drafted is not None and 0 < accepted and drafted < n - 1 - accepted:
                # Steps without a draft (ngram, suffix: the summary does not count them) and
                # no chunk count: `tokens - accepted` is then the only bound, and vLLM counts
                # the drafts its last step accepted past the answer's end (up to the draft
                # length), so it can read several steps short. Nothing can be right: withheld.
                return None
            count = decode_steps(
                n,
                accepted=accepted,
                drafted_steps=drafted,
                chunks=chunks or None,
                max_step_tokens=limit,
            )
            return None if count is None else ("engine", count)
        if self.estimate_void is not None:
            return None
        source: TpsSource
        if self.step_tokens:
            source, count = "chunks", estimate_steps(n, len(self.step_tokens), limit)
        elif self.delta_events > 1:  # the first event is the prefill's token
            source, count = "average", estimate_steps(n, self.delta_events - 1, limit)
        else:
            return None
        return None if count is None else (source, count)

    def _max_step_tokens(self) -> int | None:
        """The policy's draft length + 1, or the engine's own (vLLM's summary says it)."""
        if self.max_step_tokens is not None:
            return self.max_step_tokens
        k = token_count(self.spec.get("num_spec_tokens")) if self.spec is not None else None
        return None if k is None else k + 1

    def _engine_counts(self) -> tuple[int, int | None] | None:
        """(accepted drafts, drafted steps) from the engine's per-request report; llama.cpp's
        has no count of drafted steps (None)."""
        if self.spec is None:
            return None
        acc = token_count(self.spec.get("num_accepted_draft_tokens"))
        if acc is None:
            return None
        raw = self.spec.get("num_spec_steps")
        steps = token_count(raw)
        if raw is not None and steps is None:
            return None  # a count that is not one: the report is not read
        return acc, steps

    def itl_steps(self) -> tuple[Sequence[float], Sequence[int]]:
        """(gaps, tokens per gap) whose ratios are the per-token ITL: the decode chunks, or on
        a stream without per-event usage one span of the decode time over its tokens."""
        if self.step_tokens:
            return self.step_gaps, self.step_tokens
        first, last, n = self.t_first_token, self.t_last_token, self.completion_tokens - 1
        if self.delta_events > 1 and first is not None and last is not None and n > 0:
            return (last - first,), (n,)
        return (), ()

    def itl_per_token(self) -> list[float]:
        out: list[float] = []
        for gap, tokens in zip(*self.itl_steps(), strict=True):
            out.extend([gap / tokens] * tokens)
        return out

    def phases(self) -> dict[str, float]:
        """The response's time, phase by phase (each from the end of the one before): the
        gateway's before the engine was asked, the engine's to its headers, to the first
        token (streams), to the end."""
        out: dict[str, float] = {}
        last = self.t_start
        for name, t in (
            ("gateway", self.t_engine),
            ("engine_headers", self.t_headers),
            ("first_token", self.t_first_token if self.stream else None),
            ("end", self.t_end),
        ):
            if t is not None and t >= last:
                out[name], last = t - last, t
        return out

    def server_timing(self, now: float) -> bytes:
        """The `Server-Timing` value when the response headers leave at `now`."""
        gw_end = self.t_engine if self.t_engine is not None else now
        parts = [b"gw;dur=%.1f" % ((gw_end - self.t_start) * 1000)]
        if self.t_engine is not None and self.t_headers is not None:
            parts.append(b"engine;dur=%.1f" % ((self.t_headers - self.t_engine) * 1000))
        return b", ".join(parts)

    def record_delta(self, now: float) -> None:
        """An event that carries generated tokens, on a stream without per-event counts."""
        self.delta_events += 1
        if self.t_first_token is None:
            self.t_first_token = now
        self.t_last_token = now

    def record_tokens(self, total: int, now: float) -> None:
        """A choice frame reported `total` completion tokens so far."""
        if token_count(total) is None:
            return
        delta = total - self.completion_tokens
        if delta <= 0:
            return
        self.completion_tokens = total
        # More tokens in one chunk than a step gives (the prefill step gives one): outputs of
        # several steps were merged, so chunks are not steps.
        limit = self.max_step_tokens
        if limit is not None and delta > (1 if self.t_last_token is None else limit):
            self.estimate_void = self.estimate_void or "merged"
        if self.t_last_token is None:
            self.t_first_token = now  # the prefill step's token: not a decode step
        else:
            self.step_gaps.append(now - self.t_last_token)
            self.step_tokens.append(delta)
        self.t_last_token = now

    def record_usage(self, usage: dict[str, Any]) -> None:
        """Chat/completions usage, Responses' (`input_tokens`, `input_tokens_details`,
        `output_tokens`) or Anthropic's (`input_tokens` excludes the cache reads and writes it
        lists beside it)."""
        # Each count bounded (proxy/bounds.py): one outside [0, 2^31) is as a missing one.
        prompt = token_count(usage.get("prompt_tokens", usage.get("input_tokens")))
        details = usage.get("prompt_tokens_details", usage.get("input_tokens_details"))
        cached = token_count(details.get("cached_tokens")) if isinstance(details, dict) else None
        read = token_count(usage.get("cache_read_input_tokens"))
        written = token_count(usage.get("cache_creation_input_tokens"))
        if prompt is not None:
            self.prompt_tokens = prompt + sum(v for v in (read, written) if v is not None)
        if read is not None:
            cached = read
        if cached is not None:
            self.cached_tokens = cached
        completion = token_count(usage.get("completion_tokens", usage.get("output_tokens")))
        if completion is not None and completion > self.completion_tokens:
            self.completion_tokens = completion
