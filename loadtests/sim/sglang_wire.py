"""SGLang 0.5.23's bytes, for the simulator's SGLang mode (`specrouter sim --engine sglang`):
chat and completions stream frames and bodies as its `OpenAIServingChat` and
`OpenAIServingCompletion` write them, the `sglext` spec frame, and the `/metrics` families the
gateway reads. The frozen fixtures (tests/fixtures/sglang-golden/0.5.23/) are the check.

Where it differs from vLLM's (wire.py): chat's delta carries `"reasoning_content":null`, choices
end with `"matched_stop"`, chat's finish is a frame of its own after the last text, completions'
frames say `"usage":null` without continuous usage, usage has a top-level `reasoning_tokens`,
bodies end with `"metadata":{"weight_version":"default"}`, and no `system_fingerprint`.
`matched_stop` is the stop string that ended a choice, else null (SGLang writes the EOS token's
id there; the simulator's token ids are not a real vocabulary's).
"""

from __future__ import annotations

from typing import Any

import orjson

from policies.capabilities import (
    SGLANG_CORRECT,
    SGLANG_PROPOSED,
    SGLANG_SPEC_KEY,
    SGLANG_VERIFY_CT,
    SGLEXT_KEY,
    SglangFamily,
)

Json = dict[str, Any]
DONE = b"data: [DONE]\n\n"


def sse(obj: Json) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage(prompt: int, completion: int, *, short: bool = False) -> Json:
    """SGLang's UsageInfo; `short`: a completions stream's last usage (no details keys)."""
    out: Json = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }
    if not short:
        out["prompt_tokens_details"] = None
    out["reasoning_tokens"] = 0
    if not short:
        out["completion_tokens_details"] = None
    return out


def spec_details(completion: int, steps: int, correct: int, proposed: int, k: int) -> Json:
    """`sglext.spec_tokens_details`: SGLang's accept length counts the first token."""
    return {
        "spec_accept_rate": correct / proposed if proposed else 0.0,
        "spec_accept_length": completion / steps if steps else 0.0,
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        SGLANG_CORRECT: correct,
        SGLANG_PROPOSED: proposed,
        SGLANG_VERIFY_CT: steps,
        "spec_correct_drafts_histogram": [0] * (k + 1),
        "spec_cap_lens_histogram": [],
    }


class Frames:
    """One stream's frames; `chat` or completions."""

    def __init__(
        self, *, request_id: str, created: int, model: str, chat: bool, prompt_tokens: int
    ) -> None:
        kind = "chat.completion.chunk" if chat else "text_completion"
        self.head: Json = {"id": request_id, "object": kind, "created": created, "model": model}
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self._opened: set[int] = set()

    def step(
        self,
        index: int,
        text: str,
        completion: int,
        finish: str | None,
        stop: str | None,
        *,
        continuous: bool,
    ) -> list[bytes]:
        """The frames of one engine output for one choice (`completion`: its tokens so far)."""
        out: list[bytes] = []
        if self.chat and index not in self._opened:
            self._opened.add(index)
            out.append(self.role(index))
        so_far = completion if continuous else None
        if not self.chat:
            return [self.text(index, text, so_far, finish, stop)]
        if text:
            out.append(self.text(index, text, so_far))
        if finish is not None:
            out.append(self.finish(index, finish, stop))
        return out

    def tail(self, completion: int, details: Json | None, include_usage: bool) -> list[bytes]:
        """After the last choice's finish: the spec frame when asked, the usage, [DONE]."""
        out = [] if details is None else [self.spec(details)]
        if include_usage:
            out.append(self.usage(completion))
        return [*out, DONE]

    def _choice(self, index: int, body: Json, finish: str | None, stop: str | None) -> Json:
        return {
            "index": index,
            **body,
            "logprobs": None,
            "finish_reason": finish,
            "matched_stop": stop,
        }

    def role(self, index: int) -> bytes:
        delta = {"reasoning_content": None, "role": "assistant", "content": ""}
        return sse({**self.head, "choices": [self._choice(index, {"delta": delta}, None, None)]})

    def text(
        self,
        index: int,
        text: str,
        completion: int | None,
        finish: str | None = None,
        stop: str | None = None,
    ) -> bytes:
        """A text frame; `completion`: the tokens so far, for continuous usage (None: none).
        Completions carry the finish on the last text frame, chat in a frame of its own."""
        if self.chat:
            body: Json = {"delta": {"reasoning_content": None, "content": text}}
            obj = {**self.head, "choices": [self._choice(index, body, None, None)]}
            if completion is not None:
                obj["usage"] = usage(self.prompt_tokens, completion)
            return sse(obj)
        obj = {**self.head, "choices": [self._choice(index, {"text": text}, finish, stop)]}
        obj["usage"] = None if completion is None else usage(self.prompt_tokens, completion)
        return sse(obj)

    def finish(self, index: int, finish: str, stop: str | None) -> bytes:
        """Chat's finish frame (completions finish on their last text frame)."""
        choice = self._choice(index, {"delta": {"reasoning_content": None}}, finish, stop)
        return sse({**self.head, "choices": [choice]})

    def spec(self, details: Json) -> bytes:
        obj = {**self.head, "choices": [], "usage": None, SGLEXT_KEY: {SGLANG_SPEC_KEY: details}}
        return sse(obj)

    def usage(self, completion: int) -> bytes:
        short = not self.chat
        obj = {
            **self.head,
            "choices": [],
            "usage": usage(self.prompt_tokens, completion, short=short),
        }
        return sse(obj)


def body(
    *,
    request_id: str,
    created: int,
    model: str,
    chat: bool,
    choices: list[tuple[str, str, str | None]],
    prompt_tokens: int,
    completion_tokens: int,
    details: Json | None,
) -> Json:
    """A whole answer: `choices` (text, finish, matched stop); `details` when asked."""
    out: list[Json] = []
    for i, (text, finish, stop) in enumerate(choices):
        if chat:
            inner: Json = {
                "message": {"role": "assistant", "content": text, "reasoning_content": None}
            }
        else:
            inner = {"text": text}
        out.append(
            {"index": i, **inner, "logprobs": None, "finish_reason": finish, "matched_stop": stop}
        )
    obj: Json = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": out,
        "usage": usage(prompt_tokens, completion_tokens),
        "metadata": {"weight_version": "default"},
    }
    if details is not None:
        obj[SGLEXT_KEY] = {SGLANG_SPEC_KEY: details}
    return obj


# -- /metrics ------------------------------------------------------------------------------------

_SCHED = (
    'engine_type="unified",model_name="{m}",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"'
)
_GAUGES = (
    (SglangFamily.RUNNING, "The number of running requests."),
    (SglangFamily.WAITING, "The number of requests in the waiting queue."),
    (SglangFamily.KV_USAGE, "The token usage."),
)
_COUNTERS = (
    (SglangFamily.PROMPT_TOKENS, "Number of prefill tokens processed.", "is_streaming"),
    (SglangFamily.GENERATION_TOKENS, "Number of generation tokens processed.", "is_streaming"),
    (SglangFamily.REQUESTS, "Number of requests processed.", "is_streaming"),
    (
        SglangFamily.CACHED_TOKENS,
        "Number of cached prompt tokens by source (device/host/storage).",
        "cache_source",
    ),
    (SglangFamily.SPEC_VERIFY_CALLS, "Number of speculative decoding verification calls.", ""),
)


def metrics_page(model: str, values: dict[str, float]) -> bytes:
    """The families the gateway reads, as SGLang's prometheus_client writes them (`values` by
    family name; the token and request counters all under `is_streaming="true"`)."""
    lines: list[str] = []
    for name, doc in _GAUGES:
        lines += [f"# HELP {name} {doc}", f"# TYPE {name} gauge"]
        lines.append(f"{name}{{{_SCHED.format(m=model)}}} {float(values.get(name, 0.0))!r}")
    for name, doc, label in _COUNTERS:
        total = name + "_total"
        lines += [f"# HELP {total} {doc}", f"# TYPE {total} counter"]
        if label == "is_streaming":
            labels = f'is_streaming="true",model_name="{model}"'
        elif label:
            labels = f'cache_source="total",model_name="{model}"'
        else:
            labels = f'model_name="{model}"'
        lines.append(f"{total}{{{labels}}} {float(values.get(name, 0.0))!r}")
    return ("\n".join(lines) + "\n").encode()
