"""Tool calls and reasoning in the simulator, as vLLM 0.28.0 emits them.

Chat: the golden fixtures' engine outputs go through the simulator's parsers and chunk writer and
must give the fixtures' bytes (after the README's normalisation). Responses: there is no golden
fixture with tools or reasoning; the event structure and order follow vLLM 0.28.0's Responses
serving code (the simple, non-Harmony streaming processor).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from loadtests.harness.sim import SimServer, sse_data
from loadtests.sim import scripted, toolparse, wire
from loadtests.sim.scripted import Call, Tool, Turn

GOLDEN = Path(__file__).resolve().parents[2] / "shared/reference/vllm-golden/0.28.0"
if not GOLDEN.is_dir():
    GOLDEN = Path("/work/shared/reference/vllm-golden/0.28.0")
MODEL = "qwen3.8-27b"
WEATHER = Call("get_weather", {"city": "Paris", "unit": "celsius"})


def _norm(raw: str) -> str:
    raw = re.sub(r"chatcmpl-tool-[0-9a-f]{16}", "chatcmpl-tool-<ID>", raw)
    raw = re.sub(r"chatcmpl-[0-9a-f]{16}", "chatcmpl-<ID>", raw)
    return re.sub(r"-[0-9a-f]{8}\"", '-<H>"', raw)


def _fixture(name: str) -> tuple[dict[str, Any], str]:
    meta = json.loads((GOLDEN / f"{name}.input.json").read_text())
    ext = "sse" if "stream" in name else "json"
    return meta, (GOLDEN / f"{name}.{ext}").read_text()


def _parser_for(meta: dict[str, Any]) -> toolparse.ChatParser:
    server = meta["server"]
    tools = {t["function"]["name"]: t["function"]["parameters"]
             for t in meta["request_body"].get("tools", [])}
    return toolparse.ChatParser(reasoning=server["reasoning_parser"] == "qwen3",
                                tool_parser=server["tool_call_parser"], tools=tools)


def _replay_stream(meta: dict[str, Any]) -> str:
    body = meta["request_body"]
    opts = body.get("stream_options") or {}
    parser = _parser_for(meta)
    chunks = wire.ChatChunks(
        request_id=meta["request_id"], created=meta["created"], model=MODEL,
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        fingerprint="vllm-0.28.0-d68afdc4",
        prompt_tokens=len(meta["engine_outputs"]["prompt_token_ids"]),
        prompt_token_ids=None, return_token_ids=False,
        parsers=[parser], tool_finish=True,
    )
    out = [chunks.role(0)]
    completion = 0
    for step in meta["engine_outputs"]["request_outputs"]:
        (o,) = step["outputs"]
        completion += len(o["token_ids"])
        frame = chunks.content(0, o["text"], o["token_ids"], completion, o["finish_reason"],
                               o["stop_reason"])
        if frame:
            out.append(frame)
    if chunks.include_usage:
        out.append(chunks.usage_chunk(completion, None))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out).decode()


STREAM_FIXTURES = ["chat_stream_tools_qwen3_coder", "chat_stream_tools_hermes",
                   "chat_stream_tools_qwen3_coder_noreasoning", "chat_stream_reasoning",
                   "chat_stream_reasoning_continuous"]


@pytest.mark.parametrize("name", STREAM_FIXTURES)
def test_chat_stream_matches_golden(name: str) -> None:
    meta, expected = _fixture(name)
    got = _replay_stream(meta)
    assert _norm(got).split("\n\n") == _norm(expected).split("\n\n")


@pytest.mark.parametrize("name", ["chat_full_tools_qwen3_coder", "chat_full_tools_hermes",
                                  "chat_full_reasoning"])
def test_chat_full_matches_golden(name: str) -> None:
    meta, expected = _fixture(name)
    parser = _parser_for(meta)
    (final,) = meta["engine_outputs"]["request_outputs"][-1:]
    text = "".join(s["outputs"][0]["text"] for s in meta["engine_outputs"]["request_outputs"])
    ids = [t for s in meta["engine_outputs"]["request_outputs"] for t in s["outputs"][0]["token_ids"]]
    parser.count_tokens(ids)
    content, reasoning, calls = toolparse.parse_full(
        text, reasoning=parser.reasoning, tool_parser=parser.tool_parser, tools=parser.schemas)
    finish = "tool_calls" if calls else final["outputs"][0]["finish_reason"]
    body = wire.chat_response(
        request_id=meta["request_id"], created=meta["created"], model=MODEL,
        choices=[(wire.chat_message(content, reasoning, calls), finish, None, None)],
        prompt_tokens=len(meta["engine_outputs"]["prompt_token_ids"]),
        completion_tokens=len(ids), fingerprint="vllm-0.28.0-d68afdc4",
        prompt_token_ids=None, metrics=None, reasoning_tokens=parser.reasoning_tokens)
    got = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    assert _norm(got) == _norm(expected)


@pytest.mark.parametrize("parser", ["qwen3_coder", "hermes"])
def test_rendered_markup_is_the_fixtures(parser: str) -> None:
    """The simulator writes the tool-call markup exactly as the fixtures' model output."""
    name = {"qwen3_coder": "chat_stream_tools_qwen3_coder",
            "hermes": "chat_stream_tools_hermes"}[parser]
    meta, _ = _fixture(name)
    text = "".join(s["outputs"][0]["text"] for s in meta["engine_outputs"]["request_outputs"])
    turn = Turn("\nNeed the weather tool.\n", None, (WEATHER,))
    assert toolparse.render(turn, parser) == text
    assert toolparse.pieces(text)[:1] == ["<think>"]
