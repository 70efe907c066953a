"""The simulator renders `developer` messages as vLLM 0.28.0-0.33.0 do for a template without
that role (Qwen's): merged into one system message at the top. Codex's resumed turn, which adds
one mid-thread, then loses the prefix cache after the first system block, on the simulated GB10
as on real vLLM (tests/engines/vllm/test_vllm_agent_replay.py); through the gateway with
`developer_in_place`, it keeps it."""

from __future__ import annotations

import copy
import gzip
import json
import sqlite3
import time
from contextlib import closing
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


LOSS = ("expected_tokens", "lost_tokens", "loss_cause", "loss_where")


def _rows(gw: GatewayServer, since: float, n: int) -> list[sqlite3.Row]:
    """The request log's rows since `since` once `n` are written (it writes every 0.5 s)."""
    deadline = time.monotonic() + 10
    while True:
        with closing(sqlite3.connect(gw.dir / "state" / "requests.sqlite3")) as conn:
            conn.row_factory = sqlite3.Row
            try:
                rows = conn.execute(
                    "SELECT * FROM requests WHERE time >= ? ORDER BY time", (since,)
                ).fetchall()
            except sqlite3.OperationalError:  # the table is made with the first batch
                rows = []
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def _metric(gw: GatewayServer, name: str) -> float:
    line = next((x for x in gw.metrics().splitlines() if x.startswith(name + " ")), None)
    return 0.0 if line is None else float(line.split()[-1])


def test_resumed_codex_turn_loses_then_keeps_its_prefix(certs: Any) -> None:
    """Codex's turns 2 and 3 (`exec resume`, a new developer message after the thread): sent
    straight to the simulator, turn 3 misses part of turn 2's prompt (its merged system message
    differs; the simulator writes the tools before it, so the miss is the short thread after
    it); through a gateway whose backend sets `developer_in_place`, it hits every whole block of
    turn 2's prompt, and the request log says so; a rewrite of its first message then loses it,
    logged and counted as the client's."""
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
            since = time.time()
            _usage(c.post("/v1/responses", json=turns[2]))
            kept = _usage(c.post("/v1/responses", json=turns[3]))
            # the client rewrites its first message: the turn loses the prefix after it
            rewritten = copy.deepcopy(turns[3])  # a date line added to its first message
            part = rewritten["input"][0]["content"][0]
            part["text"] = "Today is 2026-12-03. " + part["text"]
            _usage(c.post("/v1/responses", json=rewritten))
            rows = _rows(gw, since, 3)
            lost = _metric(
                gw, 'specrouter_prefix_lost_tokens_total{backend="coder-a",cause="client-rewrite"}'
            )
    block = next(f.default for f in fields(Profile) if f.name == "block_size")
    assert isinstance(block, int)
    whole = before["input_tokens"] // block * block
    cached = [u["input_tokens_details"]["cached_tokens"] for u in (resumed, kept)]
    assert cached[0] < whole <= cached[1], (cached, before["input_tokens"])
    # The request log's accounting of the same turns: the resumed turn extends its predecessor
    # and found every whole block it should have; the rewritten one lost what followed the
    # first changed byte (the simulator writes the tools before the messages: those it kept).
    first, resumed_row, rewrite_row = ([r[k] for k in LOSS] for r in rows)
    assert first == [None, None, None, None]  # nothing to compare with
    assert resumed_row == [whole, 0, None, None]
    assert rewrite_row[2:] == ["client-rewrite", "input[0]"]
    assert 0 < rewrite_row[0] < rewrite_row[1] == lost
