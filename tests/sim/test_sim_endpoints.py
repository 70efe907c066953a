"""Embeddings, Responses API, models, version, health, CLI output."""

from __future__ import annotations

import base64
import json
import math
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from loadtests.harness.sim import SimServer

MODEL = "coder"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("dflash7-prob-block", served_model_name=MODEL) as s:
        yield s


@pytest.fixture(scope="module")
def embed() -> Iterator[SimServer]:
    with SimServer("embed", served_model_name="embed-small", extra_args=("--embed-dim", "64")) as s:
        yield s


def test_embeddings_shape_and_determinism(embed: SimServer) -> None:
    resp = httpx.post(
        embed.url + "/v1/embeddings",
        json={"model": "embed-small", "input": ["hello world", "other"]},
        timeout=10,
    )
    assert resp.status_code == 200
    body = resp.json()
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert (
        body["id"].startswith("embd-")
        and body["object"] == "list"
        and body["model"] == "embed-small"
    )
    assert [list(d) for d in body["data"]] == [["index", "object", "embedding"]] * 2
    a, b = (d["embedding"] for d in body["data"])
    assert len(a) == 64 and math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-5) and a != b
    assert body["usage"] == {
        "prompt_tokens": body["usage"]["prompt_tokens"],
        "total_tokens": body["usage"]["prompt_tokens"],
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    again = httpx.post(
        embed.url + "/v1/embeddings", json={"input": "hello world"}, timeout=10
    ).json()
    assert again["data"][0]["embedding"] == a
    b64 = httpx.post(
        embed.url + "/v1/embeddings",
        json={"input": "hello world", "encoding_format": "base64"},
        timeout=10,
    ).json()
    raw = base64.b64decode(b64["data"][0]["embedding"])
    assert list(struct.unpack("<64f", raw)) == pytest.approx(a)
    short = httpx.post(
        embed.url + "/v1/embeddings", json={"input": "hello world", "dimensions": 16}, timeout=10
    ).json()
    assert len(short["data"][0]["embedding"]) == 16


def test_embeddings_with_the_sdk_and_errors(embed: SimServer) -> None:
    client = openai.OpenAI(base_url=embed.url + "/v1", api_key="none")
    out = client.embeddings.create(model="embed-small", input="def f(): pass")
    assert len(out.data[0].embedding) == 64
    resp = httpx.post(
        embed.url + "/v1/embeddings", json={"model": "other", "input": "x"}, timeout=10
    )
    assert resp.status_code == 404 and resp.json()["error"]["param"] == "model"
    # An embedding model serves no chat.
    assert (
        httpx.post(
            embed.url + "/v1/chat/completions", json={"messages": []}, timeout=10
        ).status_code
        == 404
    )


def test_responses_stream_events(sim: SimServer) -> None:
    body = {"model": MODEL, "input": "Write a loop.", "stream": True, "max_output_tokens": 25}
    resp = httpx.post(sim.url + "/v1/responses", json=body, timeout=10)
    assert resp.status_code == 200 and b"[DONE]" not in resp.content
    frames = [f for f in resp.content.split(b"\n\n") if f]
    events = []
    for frame in frames:
        event_line, data_line = frame.split(b"\n")
        assert event_line.startswith(b"event: ") and data_line.startswith(b"data: ")
        data = json.loads(data_line[6:])
        assert data["type"] == event_line[7:].decode()
        events.append(data)
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and list(deltas[0]) == [
        "content_index",
        "delta",
        "item_id",
        "logprobs",
        "output_index",
        "sequence_number",
        "type",
    ]
    text = "".join(e["delta"] for e in deltas)
    assert events[-4]["text"] == text
    assert events[-1]["response"]["usage"]["output_tokens"] == 25
    assert events[-1]["response"]["status"] == "incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_responses_with_the_sdk(sim: SimServer) -> None:
    client = openai.OpenAI(base_url=sim.url + "/v1", api_key="none")
    full = client.responses.create(model=MODEL, input="Write a class.", max_output_tokens=400)
    assert full.output_text and full.usage is not None
    deltas = []
    with client.responses.stream(
        model=MODEL, input="Write a class.", max_output_tokens=400
    ) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert "".join(deltas) == full.output_text == final.output_text


def test_models_version_health(sim: SimServer) -> None:
    models = httpx.get(sim.url + "/v1/models", timeout=5).json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert list(card) == [
        "id",
        "object",
        "created",
        "owned_by",
        "root",
        "parent",
        "max_model_len",
        "permission",
    ]
    assert card["id"] == MODEL and card["owned_by"] == "vllm" and card["max_model_len"] == 262144
    assert card["permission"][0]["id"].startswith("modelperm-")
    version = httpx.get(sim.url + "/version", timeout=5).json()
    assert version["version"] == "0.28.0"
    info = version["specrouter_sim"]
    assert (
        info["profile"] == "dflash7-prob-block" and info["time_scale"] == 0.05 and info["seed"] == 0
    )
    assert info["speculative_config"]["num_speculative_tokens"] == 7
    health = httpx.get(sim.url + "/health", timeout=5)
    assert health.status_code == 200 and health.content == b""


def test_cli_lists_profiles_and_rejects_unknown_ones() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "sim", "--list-profiles"],
        capture_output=True,
        text=True,
        check=True,
    )
    for name in (
        "mtp3",
        "dflash4-greedy",
        "dflash5-greedy",
        "dflash7-greedy",
        "dflash5-prob",
        "dflash5-prob-block",
        "dflash7-prob-block",
        "nospec",
        "embed",
    ):
        assert name in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "proxy.cli", "sim", "--profile", "nope", "--port", "0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown profile" in bad.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_signals_end_open_streams_and_exit_cleanly(sig: str) -> None:
    s = SimServer("mtp3")
    s.start()
    outcome: list[str] = []

    def read() -> None:
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
            "max_tokens": 100_000,
            "ignore_eos": True,
        }
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=20) as resp:
            for _ in resp.iter_raw():
                outcome.append("chunk")
        outcome.append("end")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        deadline = time.monotonic() + 10
        while "chunk" not in outcome and time.monotonic() < deadline:
            time.sleep(0.01)
        assert s.proc is not None
        s.proc.send_signal(getattr(signal, sig))
        assert s.proc.wait(10) == 0
        reader.join(10)
        assert outcome[-1] == "end"  # the stream was ended, not left hanging
    finally:
        s.stop()
