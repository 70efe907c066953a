"""Agent-sized request bodies, as coding agents send them every turn: a system prompt, ~24 tools
with JSON schemas, and the whole conversation so far (tool calls and their code results).

`agent_body("chat", 406 * 1024)` is about what Claude Code, Codex or OpenCode resend at the
~100K-token contexts of the source documents: a 406 KiB body of a system prompt, 24 tools and
~215 messages. The same conversation is spelled for `/v1/responses` (input items) and
`/v1/messages` (content blocks). Deterministic for a size and seed; the benchmarks
(loadtests/bench/overhead/) and the memory tests (tests/security/) share it.
"""

from __future__ import annotations

import random
from typing import Any, Literal

import orjson

Api = Literal["chat", "responses", "messages"]

_WORDS = (
    "the relay reads each frame once and forwards it unchanged to the client while the policy "
    "decides the variant from the request alone so a long conversation costs no more than a "
    "short one when nothing in it needs a change"
).split()
_CODE = '''def {name}(items: list[dict[str, Any]], limit: int = {n}) -> list[str]:
    """Return the names of at most `limit` items, skipping empty ones."""
    out: list[str] = []
    for item in items[:limit]:
        name = item.get("name") or ""
        if name and not name.startswith("_"):
            out.append(f"{{name}}:{{item.get('size', 0)}}")
    return out

'''
_TOOL_NAMES = (
    "read_file write_file edit_file list_dir glob grep bash run_tests git_status git_diff "
    "git_commit web_fetch web_search todo_write todo_read notebook_edit ask_user task "
    "apply_patch view_image lint format python_eval search_symbols"
).split()


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _schema(rng: random.Random, name: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for i in range(rng.randint(2, 6)):
        kind = rng.choice(("string", "integer", "boolean", "array"))
        prop: dict[str, Any] = {"type": kind, "description": _prose(rng, rng.randint(8, 30))}
        if kind == "array":
            prop["items"] = {"type": "string"}
        if kind == "integer":
            prop["minimum"] = 0
        props[f"{name}_arg{i}"] = prop
    return {
        "type": "object",
        "properties": props,
        "required": list(props)[:1],
        "additionalProperties": False,
    }


def _conversation(
    rng: random.Random, size: int
) -> tuple[str, list[dict[str, Any]], list[dict[str, Any]]]:
    """(system prompt, tools as (name, description, schema), turns) about `size` bytes of JSON."""
    system = (
        "You are a coding agent working in a git repository. Use the tools to read, edit and "
        "test code; keep changes small. " + _prose(rng, 1400)
    )
    tools = [
        {"name": n, "description": _prose(rng, rng.randint(20, 80)), "schema": _schema(rng, n)}
        for n in _TOOL_NAMES
    ]
    turns: list[dict[str, Any]] = [{"kind": "user", "text": "Refactor the relay loop. " * 4}]
    used = len(system) + len(orjson.dumps(tools))
    i = 0
    while used < size * 0.97:
        i += 1
        tool = rng.choice(_TOOL_NAMES)
        args = orjson.dumps({"path": f"proxy/relay/m{i}.py", "limit": rng.randint(1, 400)}).decode()
        code = "".join(
            _CODE.format(name=f"f{i}_{j}", n=rng.randint(1, 99)) for j in range(rng.randint(6, 12))
        )
        turns.append({"kind": "call", "id": f"call_{i:05d}", "tool": tool, "args": args})
        turns.append({"kind": "result", "id": f"call_{i:05d}", "text": code})
        used += len(orjson.dumps(args)) + len(orjson.dumps(code)) + 150
        if i % 12 == 0:
            turns.append({"kind": "assistant", "text": _prose(rng, 40)})
            used += 300
    turns.append({"kind": "user", "text": "Now run the tests and fix what fails in src/app.py."})
    return system, tools, turns


def _chat(system: str, tools: list[dict[str, Any]], turns: list[dict[str, Any]]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    for t in turns:
        if t["kind"] == "user":
            messages.append({"role": "user", "content": t["text"]})
        elif t["kind"] == "assistant":
            messages.append({"role": "assistant", "content": t["text"]})
        elif t["kind"] == "call":
            call = {"name": t["tool"], "arguments": t["args"]}
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": t["id"], "type": "function", "function": call}],
                }
            )
        else:
            messages.append({"role": "tool", "tool_call_id": t["id"], "content": t["text"]})
    return {
        "messages": messages,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": x["name"],
                    "description": x["description"],
                    "parameters": x["schema"],
                },
            }
            for x in tools
        ],
    }


def _responses(
    system: str, tools: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for t in turns:
        if t["kind"] in ("user", "assistant"):
            part = "input_text" if t["kind"] == "user" else "output_text"
            items.append(
                {
                    "type": "message",
                    "role": t["kind"],
                    "content": [{"type": part, "text": t["text"]}],
                }
            )
        elif t["kind"] == "call":
            items.append(
                {
                    "type": "function_call",
                    "call_id": t["id"],
                    "name": t["tool"],
                    "arguments": t["args"],
                }
            )
        else:
            items.append({"type": "function_call_output", "call_id": t["id"], "output": t["text"]})
    return {
        "instructions": system,
        "input": items,
        "tools": [
            {
                "type": "function",
                "name": x["name"],
                "description": x["description"],
                "parameters": x["schema"],
            }
            for x in tools
        ],
    }


def _messages(
    system: str, tools: list[dict[str, Any]], turns: list[dict[str, Any]]
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []

    def put(role: str, block: dict[str, Any]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].append(block)
        else:
            messages.append({"role": role, "content": [block]})

    for t in turns:
        if t["kind"] == "user":
            put("user", {"type": "text", "text": t["text"]})
        elif t["kind"] == "assistant":
            put("assistant", {"type": "text", "text": t["text"]})
        elif t["kind"] == "call":
            block = {"type": "tool_use", "id": t["id"], "name": t["tool"]}
            put("assistant", {**block, "input": orjson.loads(t["args"])})
        else:
            put(
                "user",
                {"type": "tool_result", "tool_use_id": t["id"], "content": t["text"]},
            )
    return {
        "system": [{"type": "text", "text": system}],
        "messages": messages,
        "tools": [
            {"name": x["name"], "description": x["description"], "input_schema": x["schema"]}
            for x in tools
        ],
    }


def agent_body(api: Api, size: int, *, model: str = "agent", seed: int = 7) -> dict[str, Any]:
    """An agent's request of about `size` bytes of JSON (streaming; add sampling fields)."""
    system, tools, turns = _conversation(random.Random(seed), size)
    body = {"chat": _chat, "responses": _responses, "messages": _messages}[api](
        system, tools, turns
    )
    return {"model": model, **body, "stream": True}


def one_line(api: Api, *, model: str = "agent") -> dict[str, Any]:
    """The same API's one-line prompt (the baseline the agent-sized body is compared with)."""
    text = "Refactor the relay loop."
    if api == "responses":
        return {"model": model, "input": text, "stream": True}
    return {"model": model, "messages": [{"role": "user", "content": text}], "stream": True}
