"""llama.cpp's per-request figures, read from the bytes it sends anyway.

llama.cpp streams one frame per token, ignores `continuous_usage_stats`, and puts a `timings`
object on the last frame of every chat/completions stream (the finish chunk, or the usage chunk
when the client asked for usage) and on every non-streaming body, whatever the client asked. So
the gateway adds nothing to a llama.cpp request and cuts nothing from its answer: the client's
bytes are llama.cpp's. Tokens per target step and acceptance come from `timings`
(`tps_source` "engine"); per-token ITL from the frames' arrival on the gateway's clock.

Each target step yields one token of its own plus the draft tokens it accepted, so a request of
`predicted_n` tokens took `predicted_n - draft_n_accepted` target steps (the engine's
`llamacpp:n_decode_total` moves by exactly that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from proxy.relay.measure import Measurement

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


def record_timings(m: Measurement, timings: dict[str, Any]) -> None:
    """The engine's own count of the request: tokens, prompt, cache and, when it drafted,
    accepted draft tokens and target steps (the same keys vLLM's per-request summary uses)."""
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
    steps = predicted - accepted
    m.spec = {
        "num_accepted_draft_tokens": accepted,
        "num_spec_steps": steps,
        "num_draft_tokens": timings.get(TIMINGS_DRAFT_N, 0),
        "mean_acceptance_length": predicted / steps if steps > 0 else None,
    }
