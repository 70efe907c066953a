"""The simulator renders `developer` messages as vLLM 0.28.0-0.33.0 do for a template without
that role (Qwen's): merged into one system message at the top. Codex's resumed turn, which adds
one mid-thread, then loses the prefix cache after the first system block, on the simulated GB10
as on real vLLM (tests/engines/vllm/test_vllm_agent_replay.py); through the gateway with
`developer_in_place`, it keeps it."""

from __future__ import annotations

import gzip
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from loadtests.sim.profiles import Profile
from loadtests.sim.protocol import ChatMessage, developer_as_system

CODEX = Path(__file__).resolve().parents[1] / "fixtures" / "agent-recordings" / "codex.jsonl.gz"
SERVED = "qwen3.8-27b"  # the model the recording names


def _m(role: str, text: str) -> ChatMessage:
    return ChatMessage(role=role, content=text)


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        # no developer message: as sent, even a late system message (vLLM's trigger is developer)
        (["system", "user", "system"], [("system", "0"), ("user", "1"), ("system", "2")]),
        # one leading developer message: it becomes the system message, in place
        (["developer", "user"], [("system", "0"), ("user", "1")]),
        # Codex's resumed turn: the late one joins the leading ones at the top
        (
            ["developer", "developer", "user", "assistant", "developer", "user"],
            [("system", "0\n\n1\n\n4"), ("user", "2"), ("assistant", "3"), ("user", "5")],
        ),
        (["user", "developer"], [("system", "1"), ("user", "0")]),
    ],
)
def test_developer_as_system_table(roles: list[str], expected: list[tuple[str, str]]) -> None:
    messages = [_m(role, str(i)) for i, role in enumerate(roles)]
    out = developer_as_system(messages)
    assert [(m.role, m.content) for m in out] == expected
    assert [m.role for m in messages] == roles  # the request's messages are not changed


def _codex_turns() -> dict[int, dict[str, Any]]:
    rows = [json.loads(line) for line in gzip.decompress(CODEX.read_bytes()).splitlines()]
    return {i: {**json.loads(r["body"]), "max_output_tokens": 8} for i, r in enumerate(rows)}


def _usage(resp: httpx.Response) -> dict[str, Any]:
    assert resp.status_code == 200, resp.text[:300]
    for line in resp.text.splitlines():
        if line.startswith("data: ") and '"response.completed"' in line:
            usage: dict[str, Any] = json.loads(line[6:])["response"]["usage"]
            return usage
    raise AssertionError(f"no response.completed event: {resp.text[-300:]}")


def test_resumed_codex_turn_loses_then_keeps_its_prefix(certs: Any) -> None:
    """Codex's turns 2 and 3 (`exec resume`, a new developer message after the thread): sent
    straight to the simulator, turn 3 misses part of turn 2's prompt (its merged system message
    differs; the simulator writes the tools before it, so the miss is the short thread after
    it); through a gateway whose backend sets `developer_in_place`, it hits every whole block of
    turn 2's prompt."""
    turns = _codex_turns()
    with SimServer(
        "mtp3", served_model_name=SERVED, time_scale=0.01, tool_call_parser="qwen3_coder"
    ) as sim:
        with httpx.Client(base_url=sim.url, timeout=60) as c:
            before = _usage(c.post("/v1/responses", json=turns[2]))
            resumed = _usage(c.post("/v1/responses", json=turns[3]))
        doc = coder_policy({"coder-a": sim.url}, served=SERVED)
        doc["backends"]["coder-a"]["developer_in_place"] = True
        with GatewayServer(doc, certs=certs) as gw, gw.client() as c:
            c.timeout = httpx.Timeout(60)
            kept = _usage(c.post("/v1/responses", json=turns[3]))
    block = next(f.default for f in fields(Profile) if f.name == "block_size")
    assert isinstance(block, int)
    whole = before["input_tokens"] // block * block
    cached = [u["input_tokens_details"]["cached_tokens"] for u in (resumed, kept)]
    assert cached[0] < whole <= cached[1], (cached, before["input_tokens"])
