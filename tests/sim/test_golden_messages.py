"""The simulator's Anthropic Messages bytes against vLLM 0.28.0's golden `anth_*` fixtures.

Streams and full bodies: the fixture's engine outputs are fed to the simulator's translation
(loadtests/sim/messages_wire.py), as vLLM's own converter was fed them. Errors and count_tokens:
the fixture's request goes to the simulator's app. Ids are normalised as the golden README says.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from loadtests.sim import messages_wire as mw
from loadtests.sim.profiles import load_profiles
from loadtests.sim.server import create_app
from loadtests.sim.state import SimConfig
from tests.golden import GOLDEN as GOLDEN_ROOT

GOLDEN = GOLDEN_ROOT / "0.28.0"

STREAMS = [
    "anth_stream_plain",
    "anth_stream_max_tokens",
    "anth_stream_stop_sequence",
    "anth_stream_prompt_tokens_details",
    "anth_stream_error_midstream",
]
FULL = [
    "anth_full_plain",
    "anth_full_max_tokens",
    "anth_full_stop_sequence",
    "anth_full_prompt_tokens_details",
]
# Requests answered without the engine: the fixture's body, through the simulator's app.
APP = [
    "anth_err_400_validation",
    "anth_err_400_validation_max_tokens",
    "anth_err_404_unknown_model",
    "anth_err_404_count_tokens_unknown_model",
    "anth_err_400_tools_without_auto_tool_choice",
    "anth_err_400_count_tokens_tools_without_auto_tool_choice",
]
MODEL = "qwen3.8-27b"


def _norm(data: bytes) -> bytes:
    return re.sub(rb"chatcmpl-[0-9a-f]{16}", b"<MSG_ID>", data)


def _load(name: str) -> tuple[dict[str, Any], bytes]:
    inp = json.loads((GOLDEN / f"{name}.input.json").read_text())
    ext = "sse" if name.startswith("anth_stream") else "json"
    return inp, (GOLDEN / f"{name}.{ext}").read_bytes()


def _cached(inp: dict[str, Any]) -> int | None:
    flags = inp["server"]["flags"]
    return (
        inp["engine_outputs"]["num_cached_tokens"]
        if "--enable-prompt-tokens-details" in flags
        else None
    )


@pytest.mark.parametrize("name", STREAMS)
def test_stream_matches_golden(name: str) -> None:
    inp, golden = _load(name)
    outs = inp["engine_outputs"]
    stream = mw.MessagesStream(
        message_id=inp["request_id"],
        model=MODEL,
        prompt_tokens=len(outs["prompt_token_ids"]),
        cached=_cached(inp),
    )
    frames = [stream.start()]
    tokens = 0
    for step in outs["request_outputs"]:
        (o,) = step["outputs"]
        tokens += len(o["token_ids"])
        frames += stream.delta(o["text"], o["finish_reason"])
    if not stream.failed:
        frames += stream.end(tokens)
    body = b"".join(frames)
    assert _norm(body).split(b"\n\n") == _norm(golden).split(b"\n\n")


@pytest.mark.parametrize("name", FULL)
def test_full_body_matches_golden(name: str) -> None:
    inp, golden = _load(name)
    outs = inp["engine_outputs"]
    steps = [step["outputs"][0] for step in outs["request_outputs"]]  # as the engine merges them
    text = "".join(o["text"] for o in steps)
    tokens = sum(len(o["token_ids"]) for o in steps)
    body = mw.message(
        inp["request_id"],
        MODEL,
        text,
        steps[-1]["finish_reason"],
        len(outs["prompt_token_ids"]),
        tokens,
        _cached(inp),
    )
    assert _norm(orjson.dumps(body)) == _norm(golden)  # the simulator's json_response


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    profile = load_profiles()["dflash7-prob-block"]
    app, _ = create_app(SimConfig(profile=profile, served_model_name=MODEL, time_scale=0.01))
    with TestClient(app) as c:
        yield c


@pytest.mark.parametrize("name", APP)
def test_errors_match_golden(client: TestClient, name: str) -> None:
    inp, golden = _load(name)
    path = "/v1/messages/count_tokens" if "count_tokens" in name else "/v1/messages"
    resp = client.post(path, json=inp["request_body"])
    assert resp.status_code == inp["http"]["status"]
    assert resp.content == golden


def test_count_tokens_and_a_streamed_message_through_the_app(client: TestClient) -> None:
    inp, golden = _load("anth_count_tokens")
    resp = client.post("/v1/messages/count_tokens", json=inp["request_body"])
    n = resp.json()["input_tokens"]
    # The simulator's tokenizer is not the fixture's: same shape, its own count.
    assert resp.content == golden.replace(b"17", str(n).encode()) and n > 0
    body = {**inp["request_body"], "max_tokens": 8, "stream": True}  # the same prompt
    with client.stream("POST", "/v1/messages", json=body) as r:
        raw = b"".join(r.iter_bytes())
    kinds = [f.split(b"\n", 1)[0] for f in raw.split(b"\n\n") if f]
    assert kinds[0] == b"event: message_start" and kinds[-1] == b"event: message_stop"
    assert b"event: content_block_delta" in kinds
    delta = json.loads(raw.split(b"event: message_delta\ndata: ", 1)[1].split(b"\n", 1)[0])
    assert delta["usage"]["input_tokens"] == n and delta["usage"]["output_tokens"] >= 1
