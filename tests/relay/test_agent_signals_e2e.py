"""The agents' signals through the real gateway, two simulated engines: a compaction or
auxiliary request stays on its session's engine where a main turn moves; x-codex-turn-state
issued, echoed and honoured, forged or borrowed tokens ignored; the log rows and `report --by`.

`fast` decodes ten times faster than `slow`, so once a session sits on `slow` (placed there by
a pinned first turn) a main turn moves to `fast` (`session-move`: the move pays)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.ops import report

SERVED = "qwen3.8-27b"
CHAT: dict[str, Any] = {
    "model": "coder",
    "max_tokens": 8,
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix the failing test."},
        {"role": "assistant", "content": "Looking."},
        {"role": "user", "content": "Go on."},
    ],
}
RESPONSES: dict[str, Any] = {"model": "coder", "input": "List the files.", "max_output_tokens": 8}


@pytest.fixture(scope="module")
def gw(certs) -> Iterator[GatewayServer]:
    """One stack for the module: each test has its own session ids and reads its own rows."""
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as fast,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as slow,
    ):
        doc = coder_policy({"fast": fast.url, "slow": slow.url})
        doc["backends"]["fast"]["decode_tokens_per_s"] = 300.0
        doc["backends"]["slow"]["decode_tokens_per_s"] = 30.0
        with GatewayServer(doc, certs=certs) as server:
            yield server


def _served(r: Any) -> tuple[str, str]:
    assert r.status_code == 200, r.text
    return r.headers["x-specrouter-variant"], r.headers["x-specrouter-reason"]


def _rows(gw: GatewayServer, since: float, n: int) -> list[sqlite3.Row]:
    """The rows of the requests since `since`, once `n` are written (the log writes in batches
    every 0.5 s, in the order the requests ended: all that ended before are then written)."""
    deadline = time.monotonic() + 10
    while True:
        conn = sqlite3.connect(gw.dir / "state" / "requests.sqlite3")
        conn.row_factory = sqlite3.Row
        try:
            rows = conn.execute(
                "SELECT * FROM requests WHERE time >= ? ORDER BY time", (since,)
            ).fetchall()
        except sqlite3.OperationalError:  # the table is made with the first batch
            rows = []
        finally:
            conn.close()
        if len(rows) >= n or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


def test_compaction_stays_where_a_main_turn_moves(
    gw: GatewayServer, capsys: pytest.CaptureFixture[str]
) -> None:
    since = time.time()
    session = {"x-claude-code-session-id": "cc-compact-1"}
    with gw.client() as c:
        first = c.post(
            "/v1/chat/completions", json=CHAT, headers={**session, "x-specrouter-variant": "slow"}
        )
        assert _served(first) == ("slow", "pinned")
        served = []
        for cls in ("compaction", "auxiliary", "vip", "main"):
            headers = {**session, "x-claude-code-request-class": cls}
            served.append(_served(c.post("/v1/chat/completions", json=CHAT, headers=headers)))
    assert served[:2] == [("slow", "session"), ("slow", "session")]  # kept, the rules said fast
    # an unknown class is recorded as `other` and keeps nothing: a main turn, it moves
    assert served[2] == ("fast", "session-move")
    assert served[3] == ("fast", "default")  # moved: the rules and the session agree
    rows = _rows(gw, since, 5)
    assert [(r["request_class"], r["variant"]) for r in rows] == [
        (None, "slow"),
        ("compaction", "slow"),
        ("auxiliary", "slow"),
        ("other", "fast"),
        ("main", "fast"),
    ]
    db = str(gw.dir / "state" / "requests.sqlite3")
    assert report.main(["--db", db, "--since", "all", "--by", "request_class,variant"]) == 0
    out = capsys.readouterr().out
    assert "request_class=compaction variant=slow" in out
    assert "request_class=(none) variant=slow" in out


def test_turn_state_round_trip(gw: GatewayServer) -> None:
    since = time.time()
    codex = {"session_id": "codex-thread-1"}
    with gw.client() as c, gw.client(OTHER_KEY) as other:
        # the turn's first request lands on slow (pinned here): its token names slow
        r = c.post(
            "/v1/responses", json=RESPONSES, headers={**codex, "x-specrouter-variant": "slow"}
        )
        assert _served(r) == ("slow", "pinned")
        token = r.headers["x-codex-turn-state"]
        # the same turn: the rules say fast and a move would pay; the token holds slow
        again = {**codex, "x-codex-turn-state": token}
        r = c.post("/v1/responses", json=RESPONSES, headers=again)
        assert _served(r) == ("slow", "turn-state")
        assert "x-codex-turn-state" not in r.headers  # Codex keeps the turn's first one
        # a forged token (another engine's name under slow's MAC): ignored, the session moves
        v, _, issued, mac = token.split(".")
        forged = {**codex, "x-codex-turn-state": ".".join((v, "ZmFzdA", issued, mac))}
        assert _served(c.post("/v1/responses", json=RESPONSES, headers=forged))[0] == "fast"
        # the next turn, no token: where the session now is, and a new token naming it
        r = c.post("/v1/responses", json=RESPONSES, headers=codex)
        assert _served(r) == ("fast", "default")
        assert r.headers["x-codex-turn-state"] != token
        # another client replaying this client's token for the same thread id: ignored
        r = other.post("/v1/responses", json=RESPONSES, headers=again)
        assert _served(r) == ("fast", "default")
        # a chat request (not Codex's Responses) gets no token
        chat = c.post("/v1/chat/completions", json=CHAT, headers=codex)
        assert "x-codex-turn-state" not in chat.headers
        # slow leaves the route: a token naming it, valid when issued, is refused (not `valid`)
        before = _put_variants(gw, ["fast"])
        try:
            assert _served(c.post("/v1/responses", json=RESPONSES, headers=again))[0] == "fast"
        finally:  # the module's other tests share this gateway
            _put_route(gw, before)
    rows = _rows(gw, since, 7)
    assert [r["turn_state"] for r in rows] == [
        "issued",
        "valid",
        "refused",
        "issued",
        "refused",
        None,
        "refused",
    ]


def _put_variants(gw: GatewayServer, variants: list[str]) -> dict[str, Any]:
    """The coder route served by `variants` alone; returns the route as it was."""
    route = _policy(gw)["document"]["routes"]["coder"]
    _put_route(gw, {**route, "variants": variants, "fallback": variants[-1]})
    return dict(route)


def _policy(gw: GatewayServer) -> Any:
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    return httpx.get(gw.admin + "/admin/policy", headers=auth, timeout=10).json()


def _put_route(gw: GatewayServer, route: dict[str, Any]) -> None:
    current = _policy(gw)
    doc = current["document"]
    doc["routes"]["coder"] = route
    put = httpx.put(
        gw.admin + "/admin/policy",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "if-match": f'"{current["version"]}"'},
        json=doc,
        timeout=10,
    )
    assert put.status_code == 200, put.text
