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
from typing import Any

import httpx
import openai
import pytest

from loadtests.harness.sim import SimServer, sse_data
from loadtests.sim import scripted, toolparse, wire
from loadtests.sim.scripted import Call, Tool, Turn
from tests.golden import GOLDEN as GOLDEN_ROOT

GOLDEN = GOLDEN_ROOT / "0.28.0"
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
    tools = {
        t["function"]["name"]: t["function"]["parameters"]
        for t in meta["request_body"].get("tools", [])
    }
    return toolparse.ChatParser(
        reasoning=server["reasoning_parser"] == "qwen3",
        tool_parser=server["tool_call_parser"],
        tools=tools,
    )


def _replay_stream(meta: dict[str, Any]) -> str:
    body = meta["request_body"]
    opts = body.get("stream_options") or {}
    parser = _parser_for(meta)
    chunks = wire.ChatChunks(
        request_id=meta["request_id"],
        created=meta["created"],
        model=MODEL,
        include_usage=bool(opts.get("include_usage")),
        continuous_usage=bool(opts.get("continuous_usage_stats")),
        fingerprint="vllm-0.28.0-d68afdc4",
        prompt_tokens=len(meta["engine_outputs"]["prompt_token_ids"]),
        prompt_token_ids=None,
        return_token_ids=False,
        parsers=[parser],
        tool_finish=True,
    )
    out = [chunks.role(0)]
    completion = 0
    for step in meta["engine_outputs"]["request_outputs"]:
        (o,) = step["outputs"]
        completion += len(o["token_ids"])
        frame = chunks.content(
            0, o["text"], o["token_ids"], completion, o["finish_reason"], o["stop_reason"]
        )
        if frame:
            out.append(frame)
    if chunks.include_usage:
        out.append(chunks.usage_chunk(completion, None, 0))
    out.append(b"data: [DONE]\n\n")
    return b"".join(out).decode()


STREAM_FIXTURES = [
    "chat_stream_tools_qwen3_coder",
    "chat_stream_tools_hermes",
    "chat_stream_tools_qwen3_coder_noreasoning",
    "chat_stream_reasoning",
    "chat_stream_reasoning_continuous",
]


@pytest.mark.parametrize("name", STREAM_FIXTURES)
def test_chat_stream_matches_golden(name: str) -> None:
    meta, expected = _fixture(name)
    got = _replay_stream(meta)
    assert _norm(got).split("\n\n") == _norm(expected).split("\n\n")


@pytest.mark.parametrize(
    "name", ["chat_full_tools_qwen3_coder", "chat_full_tools_hermes", "chat_full_reasoning"]
)
def test_chat_full_matches_golden(name: str) -> None:
    meta, expected = _fixture(name)
    parser = _parser_for(meta)
    (final,) = meta["engine_outputs"]["request_outputs"][-1:]
    text = "".join(s["outputs"][0]["text"] for s in meta["engine_outputs"]["request_outputs"])
    ids = [
        t for s in meta["engine_outputs"]["request_outputs"] for t in s["outputs"][0]["token_ids"]
    ]
    parser.count_tokens(ids)
    content, reasoning, calls = toolparse.parse_full(
        text, reasoning=parser.reasoning, tool_parser=parser.tool_parser, tools=parser.schemas
    )
    finish = "tool_calls" if calls else final["outputs"][0]["finish_reason"]
    body = wire.chat_response(
        request_id=meta["request_id"],
        created=meta["created"],
        model=MODEL,
        choices=[(wire.chat_message(content, reasoning, calls), finish, None, None)],
        prompt_tokens=len(meta["engine_outputs"]["prompt_token_ids"]),
        completion_tokens=len(ids),
        fingerprint="vllm-0.28.0-d68afdc4",
        prompt_token_ids=None,
        metrics=None,
        reasoning_tokens=parser.reasoning_tokens,
    )
    got = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    assert _norm(got) == _norm(expected)


@pytest.mark.parametrize("parser", ["qwen3_coder", "hermes"])
def test_rendered_markup_is_the_fixtures(parser: str) -> None:
    """The simulator writes the tool-call markup exactly as the fixtures' model output."""
    name = {"qwen3_coder": "chat_stream_tools_qwen3_coder", "hermes": "chat_stream_tools_hermes"}[
        parser
    ]
    meta, _ = _fixture(name)
    text = "".join(s["outputs"][0]["text"] for s in meta["engine_outputs"]["request_outputs"])
    turn = Turn("\nNeed the weather tool.\n", None, (WEATHER,))
    assert toolparse.render(turn, parser) == text
    assert toolparse.pieces(text)[:1] == ["<think>"]


# -- the script -----------------------------------------------------------------------------

SHELL = {
    "type": "function",
    "function": {
        "name": "shell",
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "array", "items": {"type": "string"}},
                "workdir": {"type": "string"},
            },
            "required": ["command"],
        },
    },
}
PATCH_TOOL = {
    "type": "function",
    "function": {
        "name": "apply_patch",
        "parameters": {
            "type": "object",
            "properties": {"input": {"type": "string"}},
            "required": ["input"],
        },
    },
}
ODD = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 3},
                "mode": {"type": "string", "enum": ["fast", "slow"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "opt": {"type": "string"},
            },
            "required": ["n", "mode", "tags"],
        },
    },
}


def test_script_per_tool_name_is_fixed_and_inert() -> None:
    tools = scripted.chat_tools([SHELL, PATCH_TOOL])
    first = scripted.decide(tools, None, 0, thinking=False)
    assert first == scripted.decide(tools, None, 0, thinking=False)
    assert first.calls == (Call("shell", {"command": ["bash", "-lc", "ls"]}),)
    second = scripted.decide(tools, None, 1, thinking=False)
    assert second.calls == (Call("apply_patch", {"input": scripted.PATCH}),)
    assert scripted.SCRATCH_FILE in scripted.PATCH
    refused = "writing is blocked by read-only sandbox"
    done = scripted.decide(tools, None, 2, thinking=True, results=["a.txt\nb.txt", refused])
    assert done.calls == () and done.reasoning
    # The answer says it is scripted and what the results said, not what the calls asked.
    assert done.content == scripted.final_answer(["a.txt", refused])
    assert done.content.startswith(scripted.FINAL_ANSWER) and refused in done.content
    codex = "Chunk ID: 1a\nWall time: 0.01 s\nProcess exited with code 0\nOutput:\na.txt\n"
    assert scripted.final_answer([codex, "Chunk ID: 2b\nOutput:\n"]).endswith(
        "1) Process exited with code 0: a.txt; 2) no output"
    )
    exec_cmd = [
        Tool(
            "exec_command",
            {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        )
    ]
    assert scripted.decide(exec_cmd, None, 0, thinking=False).calls[0].arguments == {"cmd": "ls"}
    (odd,) = scripted.decide(scripted.chat_tools([ODD]), None, 0, thinking=False).calls
    assert odd.arguments == {"n": 3, "mode": "fast", "tags": []}
    custom = scripted.responses_tools([{"type": "custom", "name": "apply_patch"}])
    assert scripted.decide(custom, None, 0, thinking=False).calls[0].arguments == {
        "input": scripted.PATCH
    }
    assert scripted.decide(tools, "none", 0, thinking=False).calls == ()


# -- against a real simulator ---------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_sim() -> Iterator[SimServer]:
    with SimServer(
        "mtp3",
        served_model_name=MODEL,
        time_scale=0.02,
        faults=False,
        tool_call_parser="qwen3_coder",
        reasoning_parser="qwen3",
    ) as s:
        yield s


@pytest.fixture(scope="module")
def plain_sim() -> Iterator[SimServer]:
    with SimServer("mtp3", served_model_name=MODEL, time_scale=0.02, faults=False) as s:
        yield s


def _chat(sim: SimServer, **body: Any) -> httpx.Response:
    body.setdefault("messages", [{"role": "user", "content": "List the files."}])
    return httpx.post(f"{sim.url}/v1/chat/completions", json={"model": MODEL, **body}, timeout=30)


def test_auto_tool_choice_refused_without_the_flags(plain_sim: SimServer) -> None:
    _, expected = _fixture("err_400_tools_without_auto_tool_choice")
    for choice in (None, "auto"):
        extra = {} if choice is None else {"tool_choice": choice}
        resp = _chat(plain_sim, tools=[SHELL], **extra)
        assert resp.status_code == 400
        assert resp.content == expected.encode()
    for choice in ("none", "required", {"type": "function", "function": {"name": "shell"}}):
        resp = _chat(plain_sim, tools=[SHELL], tool_choice=choice, max_tokens=300)
        assert resp.status_code == 200, resp.text
    named = _chat(
        plain_sim,
        tools=[SHELL],
        max_tokens=300,
        tool_choice={"type": "function", "function": {"name": "shell"}},
    ).json()
    assert named["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "shell"
    assert named["choices"][0]["finish_reason"] == "stop"  # named: vLLM keeps "stop"


def test_agent_loop_ends_with_openai_sdk(agent_sim: SimServer) -> None:
    """The openai SDK parses the calls (streaming and not); two calls, then a final answer."""
    client = openai.OpenAI(base_url=f"{agent_sim.url}/v1", api_key="x", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "Look around and leave a note."}]
    names: list[str] = []
    for turn in range(4):
        if turn % 2:
            resp = client.chat.completions.create(
                model=MODEL, messages=messages, tools=[SHELL, PATCH_TOOL], max_tokens=400
            )
            msg = resp.choices[0].message
            calls = msg.tool_calls or []
            finish = resp.choices[0].finish_reason
            reasoning = getattr(msg, "reasoning", None)
            content = msg.content
        else:
            stream = client.chat.completions.create(
                model=MODEL,
                messages=messages,
                stream=True,
                tools=[SHELL, PATCH_TOOL],
                max_tokens=400,
            )
            acc: dict[int, dict[str, str]] = {}
            reasoning, content, finish = "", "", None
            for chunk in stream:
                delta = chunk.choices[0].delta
                reasoning += getattr(delta, "reasoning", None) or ""
                content += delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
                for tc in delta.tool_calls or []:
                    slot = acc.setdefault(tc.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.id or slot["id"]
                    slot["name"] += (tc.function.name or "") if tc.function else ""
                    slot["arguments"] += (tc.function.arguments or "") if tc.function else ""
            calls = [
                openai.types.chat.ChatCompletionMessageToolCall(
                    id=v["id"],
                    type="function",
                    function={"name": v["name"], "arguments": v["arguments"]},
                )
                for v in acc.values()
            ]
        assert reasoning, "the qwen3 reasoning parser streams the thinking"
        if not calls:
            assert finish == "stop" and content.startswith(scripted.FINAL_ANSWER)
            break
        assert finish == "tool_calls"
        (call,) = calls
        assert call.id.startswith("chatcmpl-tool-")
        json.loads(call.function.arguments)
        names.append(call.function.name)
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.function.name,
                            "arguments": call.function.arguments,
                        },
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "ok"})
    assert names == ["shell", "apply_patch"]


def test_thinking_switched_off_per_request(agent_sim: SimServer) -> None:
    body = _chat(agent_sim, max_tokens=30, chat_template_kwargs={"enable_thinking": False}).json()
    message = body["choices"][0]["message"]
    assert message["reasoning"] is None and message["content"]
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 0}
    thinking = _chat(agent_sim, max_tokens=60).json()
    assert thinking["choices"][0]["message"]["reasoning"]
    assert thinking["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0


def _events(raw: bytes) -> list[dict[str, Any]]:
    return [json.loads(d) for d in sse_data(raw)]


RESP_TOOLS = [
    {"type": "function", "name": "shell", "parameters": SHELL["function"]["parameters"]},
    {"type": "custom", "name": "apply_patch", "format": {"type": "text"}},
]


def test_responses_stream_tool_call_events(agent_sim: SimServer) -> None:
    """No fixture exists for Responses with tools/reasoning: structure and order follow vLLM
    0.28.0's Responses serving code (simple streaming processor)."""
    body = {
        "model": MODEL,
        "input": "Look around.",
        "tools": RESP_TOOLS,
        "stream": True,
        "reasoning": {"effort": "medium"},
        "max_output_tokens": 400,
    }
    raw = httpx.post(f"{agent_sim.url}/v1/responses", json=body, timeout=30).content
    events = _events(raw)
    types = [e["type"] for e in events]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_part.added",
    ]
    r_done = types.index("response.reasoning_text.done")
    assert set(types[4:r_done]) == {"response.reasoning_text.delta"}
    assert types[r_done : r_done + 3] == [
        "response.reasoning_text.done",
        "response.reasoning_part.done",
        "response.output_item.done",
    ]
    added = events[r_done + 3]
    assert added["type"] == "response.output_item.added"
    assert added["item"]["type"] == "function_call" and added["item"]["name"] == "shell"
    assert added["item"]["arguments"] == "" and added["output_index"] == 1
    a_done = types.index("response.function_call_arguments.done")
    deltas = [e["delta"] for e in events[r_done + 4 : a_done]]
    assert deltas and set(types[r_done + 4 : a_done]) == {"response.function_call_arguments.delta"}
    assert json.loads("".join(deltas)) == {"command": ["bash", "-lc", "ls"]}
    assert events[a_done]["arguments"] == "".join(deltas) and events[a_done]["name"] == "shell"
    assert types[a_done + 1 :] == ["response.output_item.done", "response.completed"]
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["reasoning", "function_call"]
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def test_responses_custom_tool_then_final_answer(agent_sim: SimServer) -> None:
    client = openai.OpenAI(base_url=f"{agent_sim.url}/v1", api_key="x", max_retries=0)
    history: list[Any] = [
        {"role": "user", "content": "Look around."},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "shell",
            "arguments": '{"command": ["bash", "-lc", "ls"]}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
    ]
    resp = client.responses.create(
        model=MODEL, input=history, tools=RESP_TOOLS, max_output_tokens=400
    )
    (item,) = resp.output
    assert item.type == "custom_tool_call" and item.name == "apply_patch"
    assert item.input == scripted.PATCH
    history += [
        {"type": "custom_tool_call", "call_id": "c2", "name": "apply_patch", "input": item.input},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "Done"},
    ]
    with client.responses.stream(
        model=MODEL, input=history, tools=RESP_TOOLS, max_output_tokens=400
    ) as stream:
        final = stream.get_final_response()
    assert final.output_text == scripted.final_answer(["a.txt", "Done"])
