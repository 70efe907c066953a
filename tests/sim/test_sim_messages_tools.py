"""/v1/messages with tools and reasoning: the scripted agent loop in Anthropic blocks, and the
stream translation's ordering rules (messages_wire.MessagesStream)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from loadtests.sim import messages_wire as mw
from loadtests.sim.profiles import BUILTIN_PROFILES
from loadtests.sim.scripted import FINAL_ANSWER, SUBAGENT_PROMPT, final_answer
from loadtests.sim.server import create_app
from loadtests.sim.state import SimConfig

MODEL = "m"
BASH = {
    "name": "bash",
    "description": "Run a command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def _post(body: dict[str, Any], **flags: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        config = SimConfig(
            profile=BUILTIN_PROFILES["nospec"], served_model_name=MODEL, time_scale=0.0, **flags
        )
        app, sim = create_app(config)
        sim.engine.start()
        try:
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://sim"
            ) as client:
                return await client.post(
                    "/v1/messages", json={"model": MODEL, "max_tokens": 256, **body}, timeout=10
                )
        finally:
            await sim.engine.stop()

    return asyncio.run(go())


TOOLS = {
    "enable_auto_tool_choice": True,
    "tool_call_parser": "qwen3_coder",
    "reasoning_parser": "qwen3",
}


def _events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.decode().split("\n\n"):
        if frame:
            kind, data = frame.split("\n", 1)
            out.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_tools_need_the_flags() -> None:
    r = _post({"messages": [{"role": "user", "content": "hi"}], "tools": [BASH]})
    assert r.status_code == 400 and r.json()["type"] == "error"
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]


def test_the_scripted_loop_ends_with_an_answer() -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "look around"}]
    for turn in range(2):  # the shell-only script: two calls
        r = _post({"messages": messages, "tools": [BASH], "stream": True}, **TOOLS)
        events = _events(r.content)
        starts = [e["content_block"] for k, e in events if k == "content_block_start"]
        assert [b["type"] for b in starts] == ["thinking", "tool_use"], turn
        assert starts[1]["id"].startswith("chatcmpl-tool-") and starts[1]["name"] == "bash"
        kinds = [k for k, _ in events]
        sig = kinds.index("content_block_stop") - 1
        assert events[sig][1]["delta"]["type"] == "signature_delta"
        args = "".join(
            e["delta"]["partial_json"]
            for k, e in events
            if k == "content_block_delta" and e["index"] == 1
        )
        assert json.loads(args) == {"command": "ls"}
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
        messages += [
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": starts[1]["id"],
                        "name": "bash",
                        "input": json.loads(args),
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": starts[1]["id"], "content": "README.md"}
                ],
            },
        ]
    r = _post({"messages": messages, "tools": [BASH]}, **TOOLS)  # not streamed this time
    body = r.json()
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert len(body["content"][0]["signature"]) == 32
    # vLLM's non-streaming chat keeps the "\n\n" after </think> in the content
    assert body["content"][1]["text"] == "\n\n" + final_answer(["README.md", "README.md"])
    assert body["stop_reason"] == "end_turn"


def test_full_body_tool_use_and_named_choice() -> None:
    req = {"messages": [{"role": "user", "content": "go"}], "tools": [BASH]}
    auto = _post(req, **TOOLS).json()
    assert auto["stop_reason"] == "tool_use"
    assert auto["content"][-1]["type"] == "tool_use"
    assert auto["content"][-1]["input"] == {"command": "ls"}
    named = _post({**req, "tool_choice": {"type": "tool", "name": "bash"}}, **TOOLS).json()
    assert named["content"][-1]["name"] == "bash" and named["stop_reason"] == "end_turn"


def test_text_during_an_open_tool_use_block_follows_it() -> None:
    s = mw.MessagesStream(message_id="chatcmpl-x", model=MODEL, prompt_tokens=3)
    call = {
        "id": "chatcmpl-tool-1",
        "type": "function",
        "index": 0,
        "function": {"name": "bash", "arguments": '{"command": "l'},
    }
    frames = s.chat_delta({"tool_calls": [call]}, None)
    frames += s.chat_delta({"content": "held"}, None)
    frames += s.chat_delta(
        {"tool_calls": [{"index": 0, "function": {"arguments": 's"}'}}]}, "tool_calls"
    )
    frames += s.end(5)
    events = _events(b"".join(frames))
    assert [(k, e.get("index")) for k, e in events] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[5][1]["delta"] == {"type": "text_delta", "text": "held"}
    assert events[7][1]["delta"] == {"stop_reason": "tool_use"}


def test_output_config_format_gets_a_short_json_answer() -> None:
    schema = {
        "type": "object",
        "properties": {"title": {"type": "string"}},
        "required": ["title"],
        "additionalProperties": False,
    }
    r = _post(
        {
            "messages": [{"role": "user", "content": "title?"}],
            "max_tokens": 32000,
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        },
        **TOOLS,
    )
    body = r.json()
    assert [b["type"] for b in body["content"]] == ["thinking", "text"]
    assert json.loads(body["content"][1]["text"]) == {"title": "sim"}
    assert body["stop_reason"] == "end_turn"


AGENT = {  # Claude Code's subagent tool, its schema's shape (2.1)
    "name": "Agent",
    "description": "Launch a subagent.",
    "input_schema": {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "prompt": {"type": "string"},
            "subagent_type": {"type": "string"},
            "run_in_background": {"type": "boolean"},
        },
        "required": ["description", "prompt"],
    },
}


def _loop(first: str, tools: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Run the scripted loop to its final answer: the (name, input) of each call made."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": first}]
    calls: list[tuple[str, dict[str, Any]]] = []
    for _ in range(6):
        body = _post({"messages": messages, "tools": tools}, **TOOLS).json()
        uses = [b for b in body["content"] if b["type"] == "tool_use"]
        if not uses:
            assert body["stop_reason"] == "end_turn" and FINAL_ANSWER in body["content"][-1]["text"]
            return calls
        calls += [(u["name"], u["input"]) for u in uses]
        messages += [
            {"role": "assistant", "content": body["content"]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": u["id"], "content": "done"} for u in uses
                ],
            },
        ]
    raise AssertionError(f"no final answer after {calls}")


def test_the_loop_calls_the_subagent_tool_once_and_the_subagent_does_not() -> None:
    calls = _loop("look around", [AGENT, BASH])
    assert [name for name, _ in calls] == ["bash", "bash", "Agent"]
    spawn = calls[-1][1]
    assert spawn == {
        "description": "List the workspace",
        "prompt": SUBAGENT_PROMPT,
        "subagent_type": "general-purpose",
    }
    # The subagent's own conversation (its user turn is that prompt, wrapped as Claude Code
    # wraps it) runs the script without spawning again, even if it is offered the tool.
    wrapped = f"<system-reminder>ctx</system-reminder>\n{spawn['prompt']}"
    assert [name for name, _ in _loop(wrapped, [AGENT, BASH])] == ["bash", "bash"]
    assert _loop("only agents", [AGENT]) == [("Agent", spawn)]
