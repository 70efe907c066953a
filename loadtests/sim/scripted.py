"""What the simulated model "decides" to do when a request offers tools: a fixed, harmless script.

Agents execute the calls they get, so the calls are chosen by tool name and are inert: a shell tool
lists the working directory, an edit / apply-patch tool writes one scratch file, any other tool
gets arguments that satisfy its JSON schema with inert values. A conversation gets at most
`MAX_CALLS` calls (one per turn), then one call of a subagent tool (Claude Code's `Task` /
`Agent`) when the request offers one, unless the conversation is itself that subagent's (its user
turn carries `SUBAGENT_PROMPT`); the turn after the last call's result is a short final answer,
so an agent loop ends by itself. That answer says it is scripted and reports what each tool
result said (its first line), whatever the calls asked for: a write the agent's sandbox refused
is reported as refused. Same request, same turn: nothing here is random.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]

MAX_CALLS = 2
SCRATCH_FILE = "specrouter-sim-scratch.txt"
SCRATCH_TEXT = "written by the specrouter simulator\n"
PATCH = f"*** Begin Patch\n*** Add File: {SCRATCH_FILE}\n+{SCRATCH_TEXT}*** End Patch\n"
# The final answer's opening; `final_answer` adds what the tool results said.
FINAL_ANSWER = "(A scripted answer from specrouter's simulated GB10.)"
_GIST_CHARS = 100

_SHELL_NAMES = {"shell", "exec_command", "bash", "local_shell", "run_shell_command", "terminal"}
_EDIT_NAMES = {
    "apply_patch",
    "edit",
    "str_replace_based_edit_tool",
    "write",
    "write_file",
    "edit_file",
    "str_replace_editor",
    "multiedit",
}
# Claude Code's subagent tool: `Task`, renamed `Agent` in 2.1; its subagent runs the same script.
_SUBAGENT_NAMES = {"task", "agent"}
SUBAGENT_TYPE = "general-purpose"
SUBAGENT_PROMPT = "specrouter simulator subagent: list the working directory, then report."
_COMMAND_KEYS = ("command", "cmd", "commands", "script")
_PATH_KEYS = ("path", "file_path", "filename", "file", "target_file")
_TEXT_KEYS = ("content", "file_text", "text", "new_string", "new_str", "contents")


@dataclass(frozen=True, slots=True)
class Tool:
    """One tool the request offers. `custom` tools (Responses freeform) take one string input."""

    name: str
    parameters: Json = field(default_factory=dict)
    custom: bool = False


@dataclass(frozen=True, slots=True)
class Call:
    name: str
    arguments: Json  # custom tools: {"input": text}
    custom: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    """The model's answer: optional reasoning, then either tool calls or text (None: free text)."""

    reasoning: str | None
    content: str | None
    calls: tuple[Call, ...] = ()


def chat_tools(tools: list[Json] | None) -> list[Tool]:
    """Chat `tools` ({"type": "function", "function": {...}}), in request order."""
    out: list[Tool] = []
    for t in tools or []:
        fn = t.get("function") if isinstance(t, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            params = fn.get("parameters")
            out.append(Tool(fn["name"], params if isinstance(params, dict) else {}))
    return out


def responses_tools(tools: list[Json] | None) -> list[Tool]:
    """Responses `tools`: flat `function` tools and `custom` (freeform) tools."""
    out: list[Tool] = []
    for t in tools or []:
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            continue
        if t.get("type") == "function":
            params = t.get("parameters")
            out.append(Tool(t["name"], params if isinstance(params, dict) else {}))
        elif t.get("type") == "custom":
            out.append(Tool(t["name"], custom=True))
    return out


def _kind(name: str) -> str:
    low = name.lower()
    if low in _SUBAGENT_NAMES:
        return "subagent"
    if low in _SHELL_NAMES or "shell" in low or low.startswith("bash"):
        return "shell"
    if low in _EDIT_NAMES or "patch" in low:
        return "edit"
    return "other"


def inert(schema: Any) -> Any:
    """A value that satisfies a (simple) JSON schema and does nothing."""
    if not isinstance(schema, dict):
        return ""
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties") or {}
        return {k: inert(props.get(k)) for k in schema.get("required") or [] if k in props}
    if kind == "array":
        return [inert(schema.get("items")) for _ in range(int(schema.get("minItems", 0)))]
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum")) or 0
        step = 1 if "exclusiveMinimum" in schema else 0
        return int(low) + step if kind == "integer" else low
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return "sim"


def _command(schema: Json, shell_words: list[str]) -> Any:
    """A command shaped as the schema wants it: an argv array or one command line."""
    return shell_words if schema.get("type") == "array" else shell_words[-1]


def _arguments(tool: Tool, kind: str) -> Json:
    if tool.custom:
        return {"input": PATCH if kind == "edit" else "ls"}
    props: Json = tool.parameters.get("properties") or {}
    args = inert(tool.parameters)
    if not isinstance(args, dict):
        args = {}
    if kind == "subagent":
        wanted = {"description": "List the workspace", "prompt": SUBAGENT_PROMPT}
        wanted["subagent_type"] = SUBAGENT_TYPE
        return {**args, **{k: v for k, v in wanted.items() if k in props or not props}}
    if kind == "shell":
        key = next((k for k in _COMMAND_KEYS if k in props), None)
        args[key or "command"] = _command(props.get(key or "command") or {}, ["bash", "-lc", "ls"])
        return args
    if kind == "edit":
        if "command" in props:  # str_replace_based_edit_tool: {"command": "create", ...}
            enum = props["command"].get("enum") or []
            args["command"] = "create" if "create" in enum or not enum else enum[0]
        for key in props:
            if key in _PATH_KEYS:
                args[key] = SCRATCH_FILE
            elif key in _TEXT_KEYS:
                args[key] = SCRATCH_TEXT
            elif key in ("input", "patch"):
                args[key] = PATCH
        if not props:
            args["input"] = PATCH
    return args


def plan(tools: list[Tool], *, subagent: bool = True) -> list[Call]:
    """The calls a conversation makes, in order: a shell listing, a scratch-file edit, then
    (`subagent`: the conversation is not a subagent's own) one call of the subagent tool."""
    calls: list[Call] = []
    for kind in ("shell", "edit"):
        tool = next((t for t in tools if _kind(t.name) == kind), None)
        if tool is not None:
            calls.append(Call(tool.name, _arguments(tool, kind), tool.custom))
    spawn = next((t for t in tools if _kind(t.name) == "subagent" and not t.custom), None)
    if not calls and tools and (spawn is None or not subagent):
        calls.append(Call(tools[0].name, _arguments(tools[0], "other"), tools[0].custom))
    if len(calls) == 1 and _kind(calls[0].name) == "shell" and not calls[0].custom:
        # A shell-only agent (Codex without apply_patch) still makes two round trips.
        calls.append(calls[0])
    calls = calls[:MAX_CALLS]
    if spawn is not None and subagent:
        calls.append(Call(spawn.name, _arguments(spawn, "subagent")))
    return calls


def in_subagent(user_texts: list[str]) -> bool:
    """Whether a conversation is the one a scripted subagent call started (no second spawn)."""
    return any(SUBAGENT_PROMPT in text for text in user_texts)


def _reasoning(call: Call | None, answering: bool) -> str:
    if call is not None:
        return f"\nThe task needs a look at the workspace first. I will call {call.name}.\n"
    if answering:
        return "\nThe tool results are in; I can answer now.\n"
    return "\nThe user wants code. I will write it directly.\n"


def final_answer(results: list[str]) -> str:
    """The answer after the last call: the first line of each tool result, in order."""
    if not results:
        return f"{FINAL_ANSWER} No tool result came back."
    said = "; ".join(f"{i}) {_gist(text)}" for i, text in enumerate(results, 1))
    return f"{FINAL_ANSWER} The tool results said: {said}"


def _gist(text: str) -> str:
    """A result's first line; of a shell result with a header (Codex's `exec_command`: chunk
    id, wall time, exit code, then `Output:`), its exit line and its output's first line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if "Output:" in lines:
        head, body = lines[: lines.index("Output:")], lines[lines.index("Output:") + 1 :]
        exited = next((ln for ln in head if "exit" in ln.lower()), None)
        said = body[0] if body else "no output"
        line = f"{exited}: {said}" if exited else said
    else:
        line = lines[0] if lines else "(empty)"
    return line if len(line) <= _GIST_CHARS else line[: _GIST_CHARS - 3] + "..."


def decide(
    tools: list[Tool],
    tool_choice: Any,
    calls_made: int,
    *,
    thinking: bool,
    subagent: bool = True,
    results: list[str] | None = None,
) -> Turn:
    """This turn: the next scripted call, or the final answer once the script is used up.

    `tool_choice` "none" (or no tools) answers in text; "required" and a named function always
    call (the named one, or the script's next tool, cycling), as guided decoding forces vLLM to.
    """
    offered = [] if tool_choice == "none" else tools
    forced: str | None = None
    if isinstance(tool_choice, dict):
        fn = tool_choice.get("function") if isinstance(tool_choice.get("function"), dict) else None
        forced = (fn or tool_choice).get("name")
    if forced is not None:
        named = [t for t in offered if t.name == forced]
        calls = plan(named, subagent=subagent)
        calls = calls or [Call(t.name, _arguments(t, "other"), t.custom) for t in named]
    else:
        calls = plan(offered, subagent=subagent)
    if calls and (tool_choice == "required" or forced is not None):
        call: Call | None = calls[calls_made % len(calls)]
    else:
        call = calls[calls_made] if calls_made < len(calls) else None
    answering = bool(offered) and call is None
    reasoning = _reasoning(call, answering) if thinking else None
    if call is not None:
        return Turn(reasoning, None, (call,))
    return Turn(reasoning, final_answer(results or []) if answering else None)
