"""The pacer's bytes: vLLM's chat chunk pieces, their HTTP chunk framing, its JSON reply bodies."""

from __future__ import annotations

import time
from typing import Any

import orjson

FINGERPRINT = "vllm-0.28.0-pacer000"
FINGERPRINT_TAIL = b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"'
TOKEN = " tok"

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
USAGE = b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
CHUNK_END = b"0\r\n\r\n"
_OPEN_CHOICE = b'"finish_reason":null,"token_ids":null}]'


def http_chunk(event: bytes) -> bytes:
    """One SSE event as one HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(event), event)


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's size in tokens, estimated from its messages' JSON."""
    return max(1, len(orjson.dumps(body.get("messages", ""))) // 4)


def chunk_base(request_id: str, created: int, model: Any) -> bytes:
    """What every chunk of a stream starts with: `data: {"id", "object", "created", "model"`."""
    return (
        b'data: {"id":"chatcmpl-'
        + request_id.encode("latin-1")
        + b'","object":"chat.completion.chunk","created":%d,"model":' % created
        + orjson.dumps(model)
    )


def role_piece(head: bytes) -> bytes:
    """The role chunk (`head`: the base and the choice's opening), open for what follows."""
    return head + b'{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'


def content_piece(head: bytes, tokens: int) -> bytes:
    """A content chunk of `tokens` tokens, open for a usage object and the closing brace."""
    return (
        head + b'{"content":' + orjson.dumps(TOKEN * tokens) + b'},"logprobs":null,' + _OPEN_CHOICE
    )


def last_piece(piece: bytes) -> bytes:
    """A content piece as the last one: `finish_reason: "length"`."""
    return piece.replace(
        _OPEN_CHOICE, b'"finish_reason":"length","stop_reason":null,"token_ids":null}]'
    )


def error_body(message: str, kind: str, code: int) -> bytes:
    """An error in vLLM's shape."""
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


def models_body(model: str) -> bytes:
    """`GET /v1/models`: the one model, as vLLM lists it."""
    return orjson.dumps(
        {
            "object": "list",
            "data": [
                {
                    "id": model,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "vllm",
                    "root": model,
                    "parent": None,
                    "max_model_len": 32768,
                    "permission": [],
                }
            ],
        }
    )


def completion_body(request_id: str, model: Any, n: int, prompt: int) -> bytes:
    """A non-streaming chat completion of `n` tokens, as vLLM answers it."""
    return orjson.dumps(
        {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": TOKEN * n,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": None,
                    },
                    "logprobs": None,
                    "finish_reason": "length",
                    "stop_reason": None,
                    "token_ids": None,
                }
            ],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": {
                "prompt_tokens": prompt,
                "total_tokens": prompt + n,
                "completion_tokens": n,
                "prompt_tokens_details": None,
            },
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "kv_transfer_params": None,
        }
    )
