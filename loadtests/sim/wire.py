"""vLLM's bytes on the wire: SSE frames, chunk and response bodies, errors.

vLLM builds these with pydantic (`model_dump_json(exclude_unset=True)` for chunks, `model_dump()`
for full bodies); here they are plain dicts built in the models' field order and dumped with
orjson, which gives the same compact JSON. Which keys are present, and where `null` is explicit,
follows the reference (`shared/reference/vllm-wire-format.md` §1, §2.4, §6, §7) and vLLM's
`chat_completion/serving.py` and `completion/serving.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from proxy.vllm_wire import Json, sse, usage

from .sequences import SpecStats

if TYPE_CHECKING:
    from .toolparse import ChatParser

# -- usage and per-request metrics ---------------------------------------------------------------


def full_usage(
    prompt_tokens: int,
    completion_tokens: int,
    reasoning: int | None = None,
    prompt_details: Json | None = None,
) -> Json:
    """UsageInfo as `model_dump()` writes it (non-streaming bodies)."""
    out = usage(prompt_tokens, completion_tokens)
    out["prompt_tokens_details"] = prompt_details
    out["completion_tokens_details"] = (
        None if reasoning is None else {"reasoning_tokens": reasoning}
    )
    return out


_ABSENT = object()


def chunk_usage(
    prompt_tokens: int, completion_tokens: int, reasoning: int | None, *, details_null: bool = False
) -> Json:
    """A chunk's usage; `completion_tokens_details` when a reasoning parser runs, and as an
    explicit null on chat's per-chunk (continuous) usage, as vLLM writes it in both versions."""
    out = usage(prompt_tokens, completion_tokens)
    if reasoning is not None:
        out["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    elif details_null:
        out["completion_tokens_details"] = None
    return out


def prompt_details(cached: int, *, chat: bool, full: bool) -> Json:
    """`usage.prompt_tokens_details` with --enable-prompt-tokens-details (PromptTokenUsageInfo:
    chat sets `created_cache_tokens`; `model_dump()` adds the unset fields as nulls: a
    completions body's `created_cache_tokens` too, as a real 0.32.0 wrote it)."""
    out: Json = {"cached_tokens": cached}
    if chat:
        out["created_cache_tokens"] = 0
    if full:
        if not chat:
            out["created_cache_tokens"] = None
        out["multimodal_tokens"] = None
    return out


def spec_decoding(stats: SpecStats, *, full: bool) -> Json | None:
    """`metrics.speculative_decoding` (vLLM's SpeculativeDecodingMetrics), None without steps."""
    if stats.num_spec_tokens == 0 or stats.steps == 0:
        return None
    out: Json = {
        "mean_acceptance_length": 1.0 + stats.accepted / stats.steps,
        "draft_acceptance_rate": stats.accepted / stats.drafted if stats.drafted else 0.0,
        "acceptance_histogram": list(stats.histogram),
        "num_spec_steps": stats.steps,
        "num_accepted_draft_tokens": stats.accepted,
        "num_draft_tokens": stats.drafted,
        "num_spec_tokens": stats.num_spec_tokens,
    }
    if full:
        out["per_step_accepted"] = None
        out["per_step_drafted"] = None
    return out


def per_request_metrics(stats: SpecStats | None, *, full: bool) -> Json | None:
    """PerRequestMetrics with only the speculative part (timing metrics are not enabled)."""
    spec = spec_decoding(stats, full=full) if stats is not None else None
    if spec is None:
        return None
    if not full:
        return {"speculative_decoding": spec}
    return {
        "time_to_first_token_ms": None,
        "generation_time_ms": None,
        "queue_time_ms": None,
        "mean_itl_ms": None,
        "tokens_per_second": None,
        "speculative_decoding": spec,
    }


class _Chunks:
    """What the chat and completions streams share: the chunk head and the usage chunk."""

    object_kind = ""

    def __init__(
        self,
        *,
        request_id: str,
        created: int,
        model: str,
        include_usage: bool,
        continuous_usage: bool,
        fingerprint: str,
        prompt_tokens: int,
        return_token_ids: bool,
        kv_null: bool = False,
        weight_versions: bool = False,
        prompt_details: bool = False,
    ) -> None:
        # vLLM 0.33 (dialect.py): `"kv_transfer_params":null` ends every non-role chunk,
        # `"weight_versions":null` on finish choices (every completions choice).
        self.kv_null = kv_null
        self.weight_versions = weight_versions
        self.prompt_details = prompt_details
        self.head = {
            "id": request_id,
            "object": self.object_kind,
            "created": created,
            "model": model,
        }
        self.include_usage = include_usage
        self.continuous = continuous_usage
        self.fingerprint = fingerprint
        self.prompt_tokens = prompt_tokens
        self.return_token_ids = return_token_ids

    def reasoning_tokens(self, index: int | None) -> int | None:
        """Reasoning tokens of one choice (None: all), or None without a reasoning parser."""
        return None

    def end(self, obj: Json) -> bytes:
        if self.kv_null:
            obj["kv_transfer_params"] = None
        return sse(obj)

    def usage_chunk(self, completion_tokens: int, metrics: Json | None, cached: int) -> bytes:
        final = chunk_usage(self.prompt_tokens, completion_tokens, self.reasoning_tokens(None))
        if self.prompt_details:
            # UsageInfo's field order: prompt_tokens_details before completion_tokens_details
            # (a real 0.32.0 with a reasoning parser; the fixtures never had both).
            after = final.pop("completion_tokens_details", _ABSENT)
            final["prompt_tokens_details"] = prompt_details(
                cached, chat=self.object_kind != "text_completion", full=False
            )
            if after is not _ABSENT:
                final["completion_tokens_details"] = after
        obj: Json = {
            **self.head,
            "choices": [],
            "usage": final,
            "system_fingerprint": self.fingerprint,
        }
        if metrics is not None:
            obj["metrics"] = metrics
        return sse(obj)


# -- chat completions ----------------------------------------------------------------------------


class ChatChunks(_Chunks):
    """Frames of one `/v1/chat/completions` stream."""

    object_kind = "chat.completion.chunk"

    def __init__(
        self,
        *,
        prompt_token_ids: list[int] | None,
        parsers: list[ChatParser] | None = None,
        tool_finish: bool = False,
        **common: Any,
    ) -> None:
        super().__init__(**common)
        self.prompt_token_ids = prompt_token_ids
        # One reasoning/tool parser per choice when the server runs parsers (toolparse.py).
        self.parsers = parsers
        self.tool_finish = tool_finish

    def reasoning_tokens(self, index: int | None) -> int | None:
        if not self.parsers or not self.parsers[0].reasoning:
            return None
        if index is not None:
            return self.parsers[index].reasoning_tokens
        return sum(p.reasoning_tokens for p in self.parsers)

    def role(self, index: int) -> bytes:
        choice = {
            "index": index,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        obj: Json = {**self.head, "choices": [choice]}
        if self.continuous:
            obj["usage"] = chunk_usage(
                self.prompt_tokens, 0, self.reasoning_tokens(0) and 0, details_null=True
            )
        obj["prompt_token_ids"] = self.prompt_token_ids if self.return_token_ids else None
        obj["prompt_text"] = None
        return sse(obj)

    def content(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        completion_tokens: int,
        finish_reason: str | None,
        stop_reason: str | None,
    ) -> bytes:
        """One choice's chunk; b"" when the parser holds everything back (no chunk at all)."""
        delta: Json | None = {"content": text}
        if self.parsers:
            parser = self.parsers[index]
            delta = parser.feed(text, token_ids, finish_reason is not None)
            if delta is None:
                return b""
            if finish_reason == "stop" and self.tool_finish and parser.tool_calls_streamed:
                finish_reason = "tool_calls"
        choice: Json = {
            "index": index,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        choice["token_ids"] = token_ids if self.return_token_ids else None
        if finish_reason is not None and self.weight_versions:
            choice["weight_versions"] = None
        obj: Json = {**self.head, "choices": [choice]}
        if self.continuous:
            obj["usage"] = chunk_usage(
                self.prompt_tokens,
                completion_tokens,
                self.reasoning_tokens(index),
                details_null=True,
            )
        if finish_reason is not None and not self.include_usage:
            obj["system_fingerprint"] = self.fingerprint
        return self.end(obj)


def chat_message(content: str | None, reasoning: str | None, tool_calls: list[Json]) -> Json:
    """ChatMessage.model_dump(): `tool_calls` only when there are some."""
    out: Json = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        out["tool_calls"] = tool_calls
    out["reasoning"] = reasoning
    return out


def chat_response(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[tuple[Json, str, str | None, list[int] | None]],
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
    prompt_token_ids: list[int] | None,
    metrics: Json | None,
    reasoning_tokens: int | None = None,
    weight_versions: bool = False,
    prompt_details: Json | None = None,
) -> Json:
    """ChatCompletionResponse.model_dump(): every field, nulls included."""
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "message": message,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop,
                "token_ids": ids,
                "routed_experts": None,
                **({"weight_versions": None} if weight_versions else {}),
            }
            for i, (message, finish, stop, ids) in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": full_usage(prompt_tokens, completion_tokens, reasoning_tokens, prompt_details),
        "prompt_logprobs": None,
        "prompt_token_ids": prompt_token_ids,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


# -- completions ---------------------------------------------------------------------------------


class CompletionChunks(_Chunks):
    """Frames of one `/v1/completions` stream: no role chunk, every choice field present."""

    object_kind = "text_completion"

    def content(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        completion_tokens: int,
        finish_reason: str | None,
        stop_reason: str | None,
        prompt_token_ids: list[int] | None,
    ) -> bytes:
        choice = {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "prompt_token_ids": prompt_token_ids,
            "token_ids": token_ids if self.return_token_ids else None,
        }
        if self.weight_versions:
            choice["weight_versions"] = None
        obj: Json = {**self.head, "choices": [choice]}
        if finish_reason is not None and not self.include_usage:
            obj["system_fingerprint"] = self.fingerprint
        if self.continuous:
            # Completions set usage after the fingerprint, but the model's field order decides
            # the JSON order: usage comes first.
            fp = obj.pop("system_fingerprint", None)
            obj["usage"] = usage(self.prompt_tokens, completion_tokens)
            if fp is not None:
                obj["system_fingerprint"] = fp
        return self.end(obj)


def completion_response(
    *,
    request_id: str,
    created: int,
    model: str,
    choices: list[tuple[str, str, str | None, list[int] | None, list[int] | None]],
    prompt_tokens: int,
    completion_tokens: int,
    fingerprint: str,
    metrics: Json | None,
    weight_versions: bool = False,
    prompt_details: Json | None = None,
) -> Json:
    """CompletionResponse.model_dump()."""
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": i,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": stop,
                "token_ids": ids,
                "prompt_logprobs": None,
                "prompt_token_ids": prompt_ids,
                "routed_experts": None,
                **({"weight_versions": None} if weight_versions else {}),
            }
            for i, (text, finish, stop, ids, prompt_ids) in enumerate(choices)
        ],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": full_usage(prompt_tokens, completion_tokens, prompt_details=prompt_details),
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": metrics,
    }


# -- embeddings, models --------------------------------------------------------------------------


def embedding_response(
    *,
    request_id: str,
    created: int,
    model: str,
    data: Sequence[Sequence[object] | str],
    prompt_tokens: int,
) -> Json:
    return {
        "id": request_id,
        "object": "list",
        "created": created,
        "model": model,
        "data": [{"index": i, "object": "embedding", "embedding": e} for i, e in enumerate(data)],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        },
    }


def model_list(*, model: str, root: str, max_model_len: int, created: int, perm_id: str) -> Json:
    return {
        "object": "list",
        "data": [
            {
                "id": model,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": perm_id,
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        ],
    }
