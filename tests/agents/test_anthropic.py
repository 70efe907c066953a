"""The Anthropic Python SDK and Claude Code over /v1/messages with tools, as docs/clients.md says.

The demo's engines run with `--enable-auto-tool-choice --tool-call-parser`, so the simulator
answers with its scripted tool calls (tool_use blocks) and then a final answer. Claude Code's
side request for a session title (no tools, `output_config.format` json_schema) gets a short
JSON answer, so it ends before `-p` exits instead of being logged `client_gone`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.agents.demo import Demo
from tests.agents.recipes import run_recipe

pytestmark = pytest.mark.slow


def _logged_ok(demo: Demo, since: float) -> None:
    rows = demo.rows(since)
    assert rows
    for row in rows:
        assert row["outcome"] == "ok" and row["completion_tokens"] > 0
        assert row["ttft_s"] is not None and 0 < row["ttft_s"] <= row["e2e_s"]


def test_anthropic_sdk_streams_a_tool_call(demo: Demo, tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    since = time.time()
    done = run_recipe("anthropic-python", demo, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("tool_use ") and "'tool_use'" in done.stdout
    _logged_ok(demo, since)


def test_claude_code_print_mode(demo: Demo, agents: Path, tmp_path: Path) -> None:
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    if not (bin_dir / "claude").exists():
        pytest.skip(f"claude is not installed in {bin_dir} (scripts/agents.sh)")
    since = time.time()
    done = run_recipe(
        "claude-code", demo, tmp_path, extra_path=(bin_dir,), env={"HOME": str(tmp_path)}
    )  # its settings and sessions: not the user's
    assert done.returncode == 0, done.stdout + done.stderr
    _logged_ok(demo, since)
