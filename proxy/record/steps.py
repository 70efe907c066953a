"""Tokens per target step: the one definition, for every engine kind, API and source.

    tokens per target step = (completion tokens - 1) / decode steps

The first token comes from the prefill step and is left out of both sides; a decode step is one
forward pass of the target model for the request (for a request run alone on vLLM, the change in
the count of `vllm:iteration_tokens_total` minus one). docs/tokens-per-step.md says where each
engine kind and speculative method gets its decode steps from. Pure arithmetic: the request log,
the metrics, the dashboard, the report and the probe all come here.

Nothing reports the decode steps themselves, so they are the largest of the lower bounds the
gateway has (each is exact in its own case, none can exceed the true count):
- `tokens - accepted`: every decode step gives one token of its own plus the drafts it accepted.
  Exact unless the engine counts drafts accepted past the answer's end (vLLM counts those of the
  last step cut by `max_tokens` or a stop; llama.cpp does not);
- `drafted_steps`: vLLM's per-request summary (`num_spec_steps`) and its `spec_decode_num_drafts`
  count only the steps that carried a draft. Exact for methods that draft at every step (draft
  model, MTP, EAGLE, DFlash), short by the steps without one for ngram and suffix;
- `chunks`: the decode chunks (or token events) of a stream, one per engine output. Exact
  unless outputs were held back (a detokenizer's partial character, a tool-call parser's
  buffer, a slow client's merged outputs, `stream_interval`);
- `tokens / max_step_tokens`: a step gives at most the draft length + 1 tokens.
So the figure needs no knowledge of the method: whichever bound is exact for it is the largest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StepCount:
    """A request's (or many requests') tokens after the first, and its decode steps."""

    tokens: int
    steps: int

    @property
    def per_step(self) -> float:
        return self.tokens / self.steps

    @property
    def accepted(self) -> int:
        """Accepted draft tokens that reached the answer (the step's own token excluded)."""
        return self.tokens - self.steps


def steps_of(
    tokens: float,
    *,
    accepted: float | None = None,
    drafted_steps: float | None = None,
    chunks: float | None = None,
    max_step_tokens: float | None = None,
) -> float | None:
    """The decode steps that gave `tokens` tokens after the first (one request's, or a window's
    of many), from what the engine and the stream gave (module docstring); None when there is
    no token to count or nothing to count the steps by."""
    if tokens <= 0:
        return None
    bounds = [b for b in (drafted_steps, chunks) if b is not None and b > 0]
    if accepted is not None and accepted >= 0:
        bounds.append(tokens - accepted)
    if not bounds:
        return None
    if max_step_tokens is not None and max_step_tokens > 0:
        bounds.append(math.ceil(tokens / max_step_tokens))
    return min(tokens, max(bounds))


def decode_steps(
    completion_tokens: int,
    *,
    accepted: int | None = None,
    drafted_steps: int | None = None,
    chunks: int | None = None,
    max_step_tokens: int | None = None,
) -> StepCount | None:
    """One request's decode steps (`steps_of`), the first token left out."""
    tokens = completion_tokens - 1
    steps = steps_of(
        tokens,
        accepted=accepted,
        drafted_steps=drafted_steps,
        chunks=chunks,
        max_step_tokens=max_step_tokens,
    )
    return None if steps is None else StepCount(tokens, int(steps))


def estimate_steps(
    completion_tokens: int, chunks: int, max_step_tokens: int | None
) -> StepCount | None:
    """The gateway's own estimate, one decode step per chunk or token event; withheld (None)
    when it gives more tokens per step than a step can (buffered or merged outputs)."""
    count = decode_steps(completion_tokens, chunks=chunks)
    if count is None or (max_step_tokens is not None and count.per_step > max_step_tokens):
        return None
    return count


def pooled(counts: list[StepCount]) -> float | None:
    """Many requests' tokens per step: their tokens over their steps (not a mean of ratios)."""
    steps = sum(c.steps for c in counts)
    return sum(c.tokens for c in counts) / steps if steps else None
