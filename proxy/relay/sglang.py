"""SGLang's per-request figures, read from its own response fields.

SGLang honours `stream_options.continuous_usage_stats` (per-chunk `usage`, put last in each
content frame), so its streams are measured as vLLM's are: TTFT and per-chunk ITL on the gateway's
clock, one decode chunk per engine output. Its per-request speculative figures come only when the
request asks `return_spec_tokens_details`: then `sglext.spec_tokens_details` closes a body, and on
a stream a frame of its own (no choices) comes after the finish frames and before the usage
chunk. `spec_verify_ct` counts the request's verify steps, one per decode step (the first token
comes from the prefill); `spec_num_correct_drafts` the accepted draft tokens. They are read onto
the keys of vLLM's per-request summary, so proxy/record/steps.py takes them as it takes vLLM's.

When the gateway asked on the client's behalf, `strip_body` and `strip_frame` take the figures out
again (a body as it passes: sglang_stream.py's `BodyCut`), so the client's bytes stay SGLang's
answer to the client's own request. One more
difference from vLLM: SGLang's completions frames say `"usage":null` where they carry no counts
(its chat frames leave the key out), so once the relay has cut the per-chunk usage,
`null_usage` puts the `null` back.
"""

from __future__ import annotations

from typing import Any

import orjson

from policies.capabilities import (
    SGLANG_ASK,
    SGLANG_CORRECT,
    SGLANG_PROPOSED,
    SGLANG_SPEC_KEY,
    SGLANG_VERIFY_CT,
    SGLEXT_KEY,
)
from proxy.bounds import token_count
from proxy.relay.sse import object_end

_SGLEXT = b',"' + SGLEXT_KEY.encode() + b'":{'
_SPEC = b'"' + SGLANG_SPEC_KEY.encode() + b'":'
_EMPTY_CHOICES = b'"choices":[]'
_DATA = b"data: "
_COMPLETION = b'"object":"text_completion"'
_USAGE = b'"usage":'


def ask(body: dict[str, Any]) -> dict[str, Any]:
    """The field to add to an SGLang request so it reports its spec figures: none when the
    client set it itself (its answer then carries them and nothing is cut)."""
    return {} if SGLANG_ASK in body else {SGLANG_ASK: True}


def spec_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """A body's or frame's `sglext.spec_tokens_details` (the first choice's when n > 1) on the
    keys of vLLM's per-request summary; None when it has none or its counts are not counts."""
    ext = obj.get(SGLEXT_KEY)
    details = ext.get(SGLANG_SPEC_KEY) if isinstance(ext, dict) else None
    if isinstance(details, list):
        details = details[0] if details else None
    if not isinstance(details, dict):
        return None
    steps = token_count(details.get(SGLANG_VERIFY_CT))
    accepted = token_count(details.get(SGLANG_CORRECT))
    if steps is None or accepted is None or steps == 0:
        return None  # no verify step: SGLang did not speculate on this request
    return {
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": token_count(details.get(SGLANG_PROPOSED)) or 0,
    }


def frame_spec(frame: bytes) -> dict[str, Any] | None:
    """The spec figures of a stream's `sglext` frame (`data: {...}` with no choices)."""
    if not is_sglext_frame(frame):
        return None
    try:
        obj = orjson.loads(frame[len(_DATA) :])
    except orjson.JSONDecodeError:
        return None
    return spec_of(obj) if isinstance(obj, dict) else None


def is_sglext_frame(frame: bytes) -> bool:
    return frame.startswith(_DATA) and _EMPTY_CHOICES in frame and _SGLEXT in frame


def _spec_span(data: bytes) -> tuple[int, int] | None:
    """The span to cut for `spec_tokens_details` in `data`: the whole `,"sglext":{...}` when it
    holds nothing else, else the member with its comma."""
    start = data.rfind(_SGLEXT)
    if start < 0:
        return None
    open_ = start + len(_SGLEXT) - 1
    end = object_end(data, open_)
    key = data.find(_SPEC, open_, end)
    if end < 0 or key < 0:
        return None
    value_end = _value_end(data, key + len(_SPEC))
    if value_end < 0:
        return None
    if key == open_ + 1 and data[value_end : value_end + 1] == b"}":
        return start, end  # the only member: the whole extension goes
    if data[value_end : value_end + 1] == b",":
        return key, value_end + 1
    return data.rfind(b",", open_, key), value_end


def _value_end(data: bytes, at: int) -> int:
    """Where the JSON object or list starting at `at` ends (one past its closing bracket)."""
    if data[at : at + 1] == b"{":
        return object_end(data, at)
    if data[at : at + 1] != b"[":
        return -1
    depth, i, in_str = 0, at, False
    while i < len(data):
        c = data[i]
        if in_str:
            if c == 0x5C:  # a backslash escapes the next byte
                i += 1
            elif c == 0x22:
                in_str = False
        elif c == 0x22:
            in_str = True
        elif c in (0x5B, 0x7B):
            depth += 1
        elif c in (0x5D, 0x7D):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def strip_body(body: bytes) -> bytes:
    """A whole response without the spec figures the gateway asked for."""
    span = _spec_span(body)
    return body if span is None else body[: span[0]] + body[span[1] :]


def strip_frame(frame: bytes) -> bytes:
    """A stream frame without the spec figures the gateway asked for: b"" for an `sglext` frame
    that held nothing else (the whole frame goes), the frame itself for any other."""
    if not is_sglext_frame(frame):
        return frame
    span = _spec_span(frame)
    if span is None:
        return frame
    cut = frame[: span[0]] + frame[span[1] :]
    return b"" if _SGLEXT not in cut else cut


def null_usage(frames: bytes) -> bytes:
    """Completions frames as SGLang writes them without per-chunk usage: `,"usage":null` last in
    every choice frame the relay cut the usage from (`frames`: what the relay hands the client
    for one upstream frame, possibly held frames before it)."""
    if _COMPLETION not in frames:
        return frames
    out = []
    for frame in frames.split(b"\n\n"):
        if frame.startswith(_DATA) and _COMPLETION in frame and _USAGE not in frame:
            close = frame.rfind(b"}")
            frame = frame[:close] + b',"usage":null' + frame[close:]
        out.append(frame)
    return b"\n\n".join(out)
