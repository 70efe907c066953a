"""llama.cpp's per-request figures, read from the bytes it sends anyway.

llama.cpp streams one frame per token, ignores `continuous_usage_stats`, and puts a `timings`
object on the last frame of every chat/completions stream (the finish chunk, or the usage chunk
when the client asked for usage) and on every non-streaming body, whatever the client asked. So
the gateway adds nothing to a llama.cpp request and cuts nothing from its answer: the client's
bytes are llama.cpp's. Tokens per target step and acceptance come from `timings`
(`tps_source` "engine"); per-token ITL from the frames' arrival on the gateway's clock. Its frames
are one per token, not one per step, so they give no estimate of their own ("token_frames").

Each decode step yields one token of its own plus the draft tokens it accepted, and the first
token comes from the prefill, so a request of `predicted_n` tokens took
`predicted_n - 1 - draft_n_accepted` decode steps (proxy/record/steps.py).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from policies.capabilities import (
    TIMINGS_CACHE_N,
    TIMINGS_DRAFT_ACCEPTED,
    TIMINGS_DRAFT_N,
    TIMINGS_KEY,
    TIMINGS_PREDICTED_N,
    TIMINGS_PROMPT_N,
)
from proxy.bounds import token_count

TIMINGS = b'"' + TIMINGS_KEY.encode() + b'":{'
_TOKEN_FRAME = b'"finish_reason":null'  # every frame but the finish and usage chunks
_ROLE = b'"role":'  # the opening role chunk (`"content":null`) carries no token


def is_token_frame(frame: bytes) -> bool:
    """A choice frame of a llama.cpp stream that carries one generated token."""
    return _TOKEN_FRAME in frame and _ROLE not in frame


def frame_timings(frame: bytes) -> dict[str, Any] | None:
    """The `timings` object of a frame, if it has one (a flat object of numbers)."""
    start = frame.find(TIMINGS)
    if start < 0:
        return None
    start += len(TIMINGS) - 1
    end = frame.find(b"}", start)
    try:
        obj = orjson.loads(frame[start : end + 1])
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class Counts(Protocol):
    """What `record_timings` fills in: a request's record (proxy/record/measure.py's Measurement)."""

    completion_tokens: int
    prompt_tokens: int | None
    cached_tokens: int | None
    spec: dict[str, Any] | None


def record_timings(m: Counts, timings: dict[str, Any]) -> None:
    """The engine's own count of the request: tokens, prompt, cache and, when it drafted,
    accepted draft tokens (the keys vLLM's per-request summary uses)."""
    predicted = token_count(timings.get(TIMINGS_PREDICTED_N))  # bounded: proxy/bounds.py
    if predicted is None or predicted <= 0:
        return
    if predicted > m.completion_tokens:
        m.completion_tokens = predicted
    prompt, cached = (
        token_count(timings.get(TIMINGS_PROMPT_N)),
        token_count(timings.get(TIMINGS_CACHE_N)),
    )
    # A continuation's prompt holds the partial answer: the first engine's count stands.
    if prompt is not None and cached is not None and m.prompt_tokens is None:
        m.prompt_tokens, m.cached_tokens = prompt + cached, cached
    accepted = token_count(timings.get(TIMINGS_DRAFT_ACCEPTED))
    if accepted is None:
        accepted = 0  # a server without a draft reports neither draft_n nor draft_n_accepted
    # No count of drafted steps: the decode steps are `predicted - 1 - accepted`.
    m.spec = {
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": timings.get(TIMINGS_DRAFT_N, 0),
    }
