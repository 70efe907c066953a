"""What an SSE frame of a chat stream holds: a token, an error, the end, usage."""

from __future__ import annotations

import contextlib

import orjson

from proxy.vllm_wire import DONE_PAYLOAD


def _frame_kind(frame: bytes) -> str:
    """'token', 'error', 'done' or 'other' for one SSE frame."""
    data = b""
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            data = line[5:].strip()
    if not data:
        return "other"
    if data == DONE_PAYLOAD:
        return "done"
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return "other"
    if not isinstance(obj, dict):
        return "other"
    if "error" in obj and not obj.get("choices"):
        return "error"
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        if (
            delta.get("content")
            or delta.get("reasoning_content")
            or delta.get("reasoning")
            or delta.get("tool_calls")
            or choice.get("text")
        ):
            return "token"
    return "other"


def _usage_prompt_tokens(frame: bytes) -> int | None:
    if b'"usage"' not in frame:
        return None
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            with contextlib.suppress(orjson.JSONDecodeError):
                obj = orjson.loads(line[5:].strip())
                usage = obj.get("usage") if isinstance(obj, dict) else None
                if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                    return int(usage["prompt_tokens"])
    return None


def completion_tokens(frame: bytes) -> int | None:
    """The running completion_tokens of a chunk with continuous usage (None without usage)."""
    if b'"completion_tokens"' not in frame:
        return None
    for line in frame.split(b"\n"):
        if line.startswith(b"data:"):
            with contextlib.suppress(orjson.JSONDecodeError):
                obj = orjson.loads(line[5:].strip())
                usage = obj.get("usage") if isinstance(obj, dict) else None
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    return int(usage["completion_tokens"])
    return None


def per_token(gaps: list[float], tokens: list[int], tokens_per_step: float | None) -> list[float]:
    """Per-token inter-token latencies: a chunk of k tokens after a gap g gives k of g/k (k
    from the chunk's usage; 0 = unknown: the engine counters' mean tokens per step)."""
    out: list[float] = []
    for gap, k in zip(gaps, tokens, strict=True):
        if k > 0:
            out.extend([gap / k] * k)
        else:
            out.append(gap / (tokens_per_step or 1.0))
    return out
