"""Record the real agents' requests against the demo (simulator), for the replay to real vLLM.

    make agent-recordings        # = PYTHONPATH=. .venv/bin/python -m tests.agents.record
    PYTHONPATH=. .venv/bin/python -m tests.agents.record claude-code   # only these sessions

Starts the demo, puts a recording TLS relay (tests/agents/tap.py) in front of it, and runs each
agent at the version scripts/agents.versions pins: Codex `exec` then two `exec resume` turns,
Claude Code `-p` (its core tools and the Agent tool, thinking; the simulator's script calls the
Agent tool once, so the subagent's own requests are in the session), aider, the Anthropic and OpenAI Python SDKs with
tools. Each
session is written to tests/fixtures/agent-recordings/<session>.jsonl.gz (one request a line,
as the agent sent it, secrets left out), plus the synthetic Codex thread begun on a provider that
encrypts its reasoning (`codex-encrypted`: the last Codex request with an earlier reasoning item
carrying `encrypted_content`, as Codex replays it). Then tests/agents/record_measure.py counts
each prompt in the tiny model's tokens on a real vLLM engine and writes the manifest.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import anthropic
import openai

from proxy.certs import make_local_ca
from tests.agents.demo import MODEL, ROOT, Demo, start_demo, stop_demo
from tests.agents.recipes import recipes
from tests.agents.tap import Tap

OUT = ROOT / "tests" / "fixtures" / "agent-recordings"
# What Codex sends as an earlier turn's reasoning when its provider encrypts reasoning (OpenAI's
# Responses API with `include: ["reasoning.encrypted_content"]`): an opaque blob, no text.
ENCRYPTED_REASONING = {
    "type": "reasoning",
    "id": "rs_0a1b2c3d4e5f60718293a4b5c6d7e8f9",
    "summary": [],
    "content": None,
    "encrypted_content": "gAAAAABpZ3Jfc3BlY3JvdXRlcl9zeW50aGV0aWNfZW5jcnlwdGVkX3JlYXNvbmluZw==",
}
CLAUDE_TOOLS = "Bash,Read,Edit,Write,Glob,Grep,Task"
CODEX_REASONING = '\nmodel_reasoning_effort = "medium"\nmodel_reasoning_summary = "auto"\n'


def agents_dir() -> Path:
    done = subprocess.run(
        [str(ROOT / "scripts" / "agents.sh")], capture_output=True, text=True, check=True
    )
    return Path(done.stdout.split()[-1])


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{argv[0]} failed:\n{done.stdout}\n{done.stderr}")


def _thread_id(jsonl: str) -> str:
    for line in jsonl.splitlines():
        if line.startswith("{") and json.loads(line).get("type") == "thread.started":
            return str(json.loads(line)["thread_id"])
    raise RuntimeError(f"no thread.started in:\n{jsonl}")


def codex(tap: Tap, env: dict[str, str], work: Path, bins: Path) -> None:
    home = work.parent / "codex-home"
    home.mkdir()
    config = recipes()["codex-config"].replace("https://127.0.0.1:8443/v1", tap.base)
    (home / "config.toml").write_text(config.replace("\n[", CODEX_REASONING + "\n[", 1))
    env = {**env, "CODEX_HOME": str(home), "PATH": f"{bins}{os.pathsep}{env['PATH']}"}
    first = ["codex", "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "--json"]
    done = subprocess.run(
        [*first, "List the files here, then add a notes file."],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(done.stdout + done.stderr)
    thread = _thread_id(done.stdout)
    for step in ("Now show me what you wrote.", "Summarise the change in one line."):
        _run(
            ["codex", "exec", "resume", "--skip-git-repo-check", "--json", thread, step], work, env
        )


def claude_code(tap: Tap, env: dict[str, str], work: Path, bins: Path) -> None:
    env = {
        **env,
        "HOME": str(work),  # its settings and sessions: not the user's
        "NODE_EXTRA_CA_CERTS": env["SPECROUTER_CA"],
        "ANTHROPIC_BASE_URL": tap.base.removesuffix("/v1"),
        "ANTHROPIC_API_KEY": env["SPECROUTER_KEY"],
        "ANTHROPIC_MODEL": MODEL,
        "MAX_THINKING_TOKENS": "1024",
        "CLAUDE_CODE_GATEWAY_HINT_HEADERS": "1",
        "PATH": f"{bins}{os.pathsep}{env['PATH']}",
    }
    # Its core tools and the subagent tool: all of them make a prompt past the tiny model's
    # 32,768 positions (about 35K of its tokens; 22K with these).
    prompt = "List the files here, then write a notes file."
    _run(["claude", "-p", prompt, "--tools", CLAUDE_TOOLS], work, env)  # --tools takes several


def aider(tap: Tap, env: dict[str, str], work: Path, bins: Path) -> None:
    (work / "hello.py").write_text("def hello():\n    return 'hi'\n")
    script = recipes()["aider"]
    env = {**env, "HOME": str(work), "SPECROUTER_URL": tap.base}
    env["PATH"] = f"{bins}{os.pathsep}{env['PATH']}"
    _run(["bash", "-c", script], work, env)


BASH_TOOL = {
    "name": "bash",
    "description": "Run a shell command",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def anthropic_sdk(tap: Tap, demo: Demo) -> None:
    """Two turns: the tool call, then its result (with the thinking block it came with)."""
    http = anthropic.DefaultHttpxClient(verify=ssl.create_default_context(cafile=demo.ca))
    with anthropic.Anthropic(
        base_url=tap.base.removesuffix("/v1"), api_key=demo.key, http_client=http, max_retries=0
    ) as client:
        messages: list[Any] = [{"role": "user", "content": "List the files here."}]
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 2048,
            "tools": [BASH_TOOL],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "system": [
                {
                    "type": "text",
                    "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
        with client.messages.stream(messages=messages, **kwargs) as stream:
            first = stream.get_final_message()
        calls = [b for b in first.content if b.type == "tool_use"]
        messages += [
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in first.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": c.id, "content": "hello.py\nnotes.txt"}
                    for c in calls
                ],
            },
        ]
        client.messages.create(messages=messages, **kwargs)


def openai_sdk(tap: Tap, demo: Demo) -> None:
    """Chat with a tool, streamed: the call, then its result."""
    http = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=demo.ca))
    tool = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": BASH_TOOL["description"],
            "parameters": BASH_TOOL["input_schema"],
        },
    }
    with openai.OpenAI(base_url=tap.base, api_key=demo.key, http_client=http, max_retries=0) as c:
        messages: list[Any] = [{"role": "user", "content": "List the files here."}]
        first = c.chat.completions.create(model=MODEL, messages=messages, tools=[tool])
        msg = first.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        messages += [
            {"role": "tool", "tool_call_id": call.id, "content": "hello.py\nnotes.txt"}
            for call in msg.tool_calls or []
        ]
        stream = c.chat.completions.create(
            model=MODEL, messages=messages, tools=[tool], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for _ in stream:
            pass


def encrypted(codex_requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last Codex request, as a thread begun on a provider that encrypts reasoning sends it:
    each earlier turn's reasoning item carries `encrypted_content` (and no readable text)."""
    last = copy.deepcopy([r for r in codex_requests if r["path"].endswith("/responses")][-1])
    body = json.loads(last["body"])
    items: list[Any] = []
    for n, item in enumerate(body["input"]):
        if item.get("type") == "reasoning":
            continue  # the simulator's own readable reasoning: replaced
        if item.get("type") in ("function_call", "custom_tool_call") or (
            item.get("role") == "assistant" and n > 0
        ):
            if not items or items[-1].get("type") != "reasoning":
                items.append({**ENCRYPTED_REASONING, "id": f"{ENCRYPTED_REASONING['id']}{n:02d}"})
        items.append(item)
    body["input"] = items
    body["include"] = ["reasoning.encrypted_content"]
    last["body"] = json.dumps(body, separators=(",", ":"))
    last["session"] = "codex-encrypted"
    return [last]


def write(sessions: dict[str, list[dict[str, Any]]]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, requests in sessions.items():
        lines = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in requests)
        (OUT / f"{name}.jsonl.gz").write_bytes(gzip.compress(lines.encode(), mtime=0))


def record(work_root: Path, only: set[str]) -> dict[str, list[dict[str, Any]]]:
    bins = agents_dir()
    npm_bin, aider_bin = bins / "npm" / "node_modules" / ".bin", bins / "aider" / "bin"
    (work_root / "demo").mkdir()
    demo = start_demo(work_root / "demo", time_scale=0.1)
    sessions: dict[str, list[dict[str, Any]]] = {}
    try:
        certs = make_local_ca(demo.state / "tls")
        with Tap(demo.port, certs) as tap:
            env = {**demo.env(), "SPECROUTER_URL": tap.base, "SSL_CERT_FILE": demo.ca}
            runs = {
                "codex": lambda w: codex(tap, env, w, npm_bin),
                "claude-code": lambda w: claude_code(tap, env, w, npm_bin),
                "aider": lambda w: aider(tap, env, w, aider_bin),
                "anthropic-sdk": lambda w: anthropic_sdk(tap, demo),
                "openai-sdk": lambda w: openai_sdk(tap, demo),
            }
            for name, run in runs.items():
                if only and name not in only:
                    continue
                tap.session = name
                work = work_root / name / "work"
                work.mkdir(parents=True)
                (work / "notes.txt").write_text("hello\n")
                run(work)
                sessions[name] = [r for r in tap.requests if r["session"] == name]
                print(f"{name}: {len(sessions[name])} requests", file=sys.stderr)
    finally:
        stop_demo(demo)
    if "codex" in sessions:
        sessions["codex-encrypted"] = encrypted(sessions["codex"])
    return sessions


def main() -> int:
    """Records every session, or those named on the command line (the others kept as they are);
    then the manifest, for all of them."""
    with tempfile.TemporaryDirectory() as tmp:
        sessions = record(Path(tmp), set(sys.argv[1:]))
    write(sessions)
    from tests.agents.record_measure import measure
    from tests.engines.vllm import replay

    measure({name: [r.__dict__ for r in replay.load(name)] for name in replay.sessions()})
    print(OUT)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
