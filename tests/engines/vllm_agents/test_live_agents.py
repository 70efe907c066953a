"""Real agents complete a tool loop through the gateway (TLS) in front of a real vLLM.

The engine serves scripts/vllm_agent_model.py's trained model with vLLM's own `qwen3_coder` tool
parser and `qwen3` reasoning parser: the first request of a loop (no tool result yet) gets a
`<think>` block and a call of the command tool the request offers (Codex: `exec_command(cmd="echo
ok")`, Claude Code and the SDK: `Bash(command="echo ok")`), the next (with the result) a `<think>`
block and a short answer, so the agent runs the command, sends its output back and prints the
answer. Each agent's first prompt is its real one (Codex 11.7K,
Claude Code 27.1K tokens in this model's tokens); the route bounds answers to conftest.MAX_TOKENS.
"""

from __future__ import annotations

import sqlite3
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import anthropic
import pytest

from loadtests.harness.gateway import CLIENT_KEY
from loadtests.harness.vllm import SERVED
from tests.engines.vllm_agents.common import ANSWER, TASK, agent_env, rows, summary
from tests.engines.vllm_agents.conftest import Stack

pytestmark = pytest.mark.slow

CODEX_CONFIG = """\
model = "{model}"
model_provider = "specrouter"

[model_providers.specrouter]
name = "specrouter"
base_url = "{url}"
env_key = "SPECROUTER_KEY"
wire_api = "responses"
"""
AGENT_TIMEOUT_S = 240  # a cold first prefill of ~25K tokens on a loaded 2-core machine


def _served(found: list[sqlite3.Row], count: int) -> None:
    assert len(found) >= count, summary(found)
    for row in found:
        # Codex sometimes hangs up once it has read the answer's end and before the stream's
        # own end (tests/agents/test_codex.py): client_gone, with the finish relayed.
        assert row["outcome"] == "ok" or (
            row["outcome"] == "client_gone" and row["finish_reason"] is not None
        ), dict(row)
        assert 0 < row["completion_tokens"] <= 64, dict(row)  # it ended; not cut at the bound
        # chat, Responses (its status), Messages
        assert row["finish_reason"] in ("stop", "completed", "end_turn", "tool_use"), dict(row)


def _run(
    stack: Stack, label: str, argv: list[str], cwd: Path, env: dict[str, str], count: int
) -> tuple[str, list[sqlite3.Row]]:
    """Run an agent to its end through the gateway: its output (stdout and stderr) and the
    gateway's rows of the requests it made (`count` at least, waited for); it exited 0 having
    printed the model's answer.

    Run once more when the model answered text where a call was due (the agent's one request,
    ended, no answer printed): the stand-in model decides from a few tokens at the end of a
    12-30K-token prompt, and answered so once in about ten full suites (Codex, in a worker);
    that says nothing of the gateway, and a gateway that breaks the loop fails both runs."""
    for attempt in (1, 2):
        since = time.time()
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=AGENT_TIMEOUT_S
        )
        out = done.stdout + done.stderr
        found = rows(stack.gateway, since, count)
        print(f"{label}, run {attempt}:\n" + summary(found))
        off_script = done.returncode == 0 and ANSWER not in done.stdout and len(found) == 1
        if not off_script:
            break
    assert done.returncode == 0, out
    assert ANSWER in done.stdout, out
    return out, found


def test_codex_exec_runs_the_tool_and_answers(stack: Stack, agents: Path, tmp_path: Path) -> None:
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(CODEX_CONFIG.format(model=SERVED, url=stack.gateway.url))
    out, found = _run(
        stack,
        "codex exec",
        ["codex", "exec", "--skip-git-repo-check", "--sandbox", "workspace-write", TASK],
        work,
        {**agent_env(stack.gateway, tmp_path, bin_dir), "CODEX_HOME": str(home)},
        2,
    )
    _served(found, 2)
    # Codex ran the call in its sandbox and sent the output back: the second prompt is longer.
    assert "succeeded in" in out, out  # its exec line (the prompt's "echo ok" is echoed too)
    assert found[1]["prompt_tokens"] > found[0]["prompt_tokens"], summary(found)


def test_claude_code_runs_the_tool_and_answers(stack: Stack, agents: Path, tmp_path: Path) -> None:
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    _, found = _run(
        stack,
        "claude -p",
        ["claude", "-p", TASK, "--allowedTools", "Bash(echo:*)"],
        tmp_path,
        {**agent_env(stack.gateway, tmp_path, bin_dir), "ANTHROPIC_MODEL": SERVED},
        3,
    )
    # Its side request for a session title (no tools, a JSON schema as `output_config.format`,
    # which vLLM enforces: the model's own answer is not JSON, the grammar holds it to the bound).
    title = [r for r in found if r["prompt_tokens"] < 2000]
    assert len(title) == 1 and title[0]["outcome"] == "ok", summary(found)
    main = [r for r in found if r not in title]
    _served(main, 2)  # the call, then the answer
    assert [r["finish_reason"] for r in main] == ["tool_use", "end_turn"], summary(found)


def test_anthropic_sdk_completes_a_tool_loop(stack: Stack) -> None:
    client = anthropic.Anthropic(
        base_url=stack.gateway.base,
        api_key=CLIENT_KEY,
        http_client=anthropic.DefaultHttpxClient(
            verify=ssl.create_default_context(cafile=str(stack.gateway.certs.ca_cert))
        ),
        timeout=120,
    )
    bash: Any = {
        "name": "Bash",
        "description": "Run a shell command",
        "input_schema": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    }
    messages: list[Any] = [{"role": "user", "content": TASK}]
    since = time.time()
    with client.messages.stream(
        model=SERVED, max_tokens=256, tools=[bash], messages=messages
    ) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use", first
    assert [b.type for b in first.content] == ["thinking", "tool_use"], first
    call = first.content[-1]
    assert call.type == "tool_use" and call.name == "Bash" and call.input == {"command": "echo ok"}
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "ok"}],
        },
    ]
    second = client.messages.create(model=SERVED, max_tokens=256, tools=[bash], messages=messages)
    assert second.stop_reason == "end_turn", second
    assert [b.type for b in second.content] == ["thinking", "text"], second
    text = second.content[-1]
    assert text.type == "text" and text.text.strip() == ANSWER
    client.close()
    _served(rows(stack.gateway, since, 2), 2)


def test_aider_gets_the_answer(stack: Stack, agents: Path, tmp_path: Path) -> None:
    """aider offers no tools (its edits are text formats): the model answers in text."""
    (tmp_path / "hello.py").write_text("def hello():\n    return 'hi'\n")
    _, found = _run(
        stack,
        "aider",
        [
            "aider",
            "--model",
            f"openai/{SERVED}",
            "--yes-always",
            "--no-git",
            "--no-show-model-warnings",
            "--no-check-update",
            "--no-analytics",
            "--message",
            "Add a docstring to hello.py",
            "hello.py",
        ],
        tmp_path,
        {
            **agent_env(stack.gateway, tmp_path, agents / "aider" / "bin"),
            "OPENAI_API_BASE": stack.gateway.url,
            "OPENAI_API_KEY": CLIENT_KEY,
        },
        1,
    )
    _served(found, 1)
