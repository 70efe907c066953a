"""The Claude Code wait benchmark, briefly: a 2 s silence, the real Claude Code when the agents'
cache has it (a stand-in Anthropic SDK client when not). The engine's first request waits out
the silence and the turn finishes; the 330 s run's figures are in docs/clients.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from loadtests.bench.claude_wait import claude_binary, main

pytestmark = pytest.mark.slow

STAND_IN = """
import anthropic
with anthropic.Anthropic().messages.stream(
        model="qwen3.8-27b", max_tokens=16, messages=[{"role": "user", "content": "Hi"}]) as s:
    print(s.get_final_message().stop_reason)
"""
WAIT_S = 2.0


def test_a_short_silence_is_waited_out_and_recorded(tmp_path: Path) -> None:
    claude = claude_binary()
    # No tools: the simulator answers at once instead of scripting tool turns (one request).
    real = [str(claude), "-p", "Hi", "--tools", ""]
    agent = ["--agent", *(real if claude.exists() else [sys.executable, "-c", STAND_IN])]
    out = tmp_path / "result.json"
    args = ["--wait", str(WAIT_S), "--keepalive", "0.5", "--finish-timeout", "60"]
    assert main([*args, "--out", str(out), *agent]) == 0
    result = json.loads(out.read_text())
    assert result["agent_exit"] == 0, result["agent_output_tail"]
    first, *_ = result["engine_arrivals_s"]
    assert result["fault_cleared_s"] >= first + WAIT_S
    rows = result["gateway_rows"]
    assert rows and all(r["outcome"] == "ok" for r in rows), rows
    # The silence held the first request (its stream's first token came after the clear).
    assert rows[0]["ttft_s"] >= WAIT_S - 0.5, rows
