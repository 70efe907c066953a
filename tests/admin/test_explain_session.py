"""`POST /admin/policy/explain` with a session: the live table's row (by the request's headers or
its key) or a row given by hand, and the stickiness arithmetic, the same as the CLI's."""

from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from loadtests.harness.gateway import coder_policy
from policies import cli as policy_cli
from policies.compiled import compile_policy
from policies.schema import load_policy
from policies.sessions import session_of
from proxy.admin.app import create_admin_app
from proxy.admin.policy_api import policy_routes
from proxy.admin.policy_store import PolicyStore
from proxy.gateway import Gateway
from proxy.settings import Settings

TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}
REQUEST: dict[str, Any] = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
HEADERS = {"X-Session-Id": "conv-1"}


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Gateway, httpx.AsyncClient, Path]:
    doc = coder_policy({"b": "http://127.0.0.1:10", "a": "http://127.0.0.1:9"})  # rules: b
    doc["backends"]["a"]["decode_tokens_per_s"] = 20.0
    doc["backends"]["b"]["decode_tokens_per_s"] = 40.0
    config = tmp_path / "policy.yaml"
    config.write_text(yaml.safe_dump(doc))
    settings = Settings(config=config, state_dir=tmp_path / "state", admin_token=TOKEN)
    gw = Gateway(settings, compile_policy(load_policy(config)))
    store = PolicyStore(gw.policy, config, settings.state_dir)
    app = create_admin_app(gw, policy_routes(gw, store))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")
    return gw, client, config


def _live_session(gw: Gateway, prefix: int) -> str:
    """A session the gateway served on `a`: its prefix there, 500 tokens out per turn."""
    sid = session_of("agent", REQUEST, {k.lower().encode(): v.encode() for k, v in HEADERS.items()})
    assert sid is not None
    now = time.perf_counter()
    gw.sessions.placed(sid, "agent", "a", now)
    gw.sessions.finished(
        sid.key,
        "a",
        now,
        prompt_tokens=prefix - 500,
        completion_tokens=500,
        cached_tokens=0,
        decode_s=1.0,
    )
    gw.sessions.lost(sid.key, 4096, "client-rewrite", "system")  # proxy/backends/prefix.py
    return sid.key


async def _explain(client: httpx.AsyncClient, **extra: Any) -> httpx.Response:
    body = {"request": REQUEST, "client": "agent", **extra}
    return await client.post("/admin/policy/explain", headers=AUTH, json=body)


@pytest.mark.parametrize("by", ["headers", "key"])
async def test_a_live_session_stays_and_the_arithmetic_says_why(setup, by: str) -> None:
    gw, client, _ = setup
    key = _live_session(gw, 300_000)
    r = await _explain(client, **({"headers": HEADERS} if by == "headers" else {"session": key}))
    assert r.status_code == 200, r.text
    out = r.json()
    assert (out["decision"]["backend"], out["decision"]["reason"]) == ("a", "session")
    s = out["session"]
    assert (s["key"], s["source"], s["engine"], s["prefix_tokens"]) == (key, "table", "a", 300_000)
    # 9 remaining turns x 500 tokens x (1/20 - 1/40) s = 112.5 s <= 300,000 / 2,000 = 150 s
    assert (s["turns"], s["verdict"]) == (1, "stay")
    assert (s["lost_tokens"], s["loss_cause"], s["loss_where"]) == (
        4096,
        "client-rewrite",
        "system",
    )
    assert s["resident_tokens"] is None  # the policy subscribes to no KV events
    assert s["detail"] == (
        "a -> b: gain 9 turns x 500 tokens = 112.50 s <= re-prefill 300000 tokens / "
        "2000 tokens/s = 150.00 s"
    )


async def test_a_new_session_is_placed_by_the_rules(setup) -> None:
    _, client, _ = setup
    r = await _explain(client, headers={"x-session-id": "never-seen"})
    s = r.json()["session"]
    assert (s["source"], s["engine"], s["verdict"]) == ("new", None, "new")
    assert r.json()["decision"]["backend"] == "b"


@pytest.mark.parametrize(
    ("row", "verdict", "backend"),
    [
        ({"engine": "a", "prefix_tokens": 20_000, "out_tokens_per_turn": 500}, "move", "b"),
        (
            {"engine": "a", "prefix_tokens": 200_000, "out_tokens_per_turn": 500, "turns": 8},
            "stay",
            "a",
        ),
    ],
)
async def test_a_given_row_explains_as_the_cli_does(setup, row, verdict, backend) -> None:
    _, client, config = setup
    r = await _explain(client, session=row, headers=HEADERS)
    assert r.status_code == 200, r.text
    s = r.json()["session"]
    assert (s["source"], s["verdict"], r.json()["decision"]["backend"]) == (
        "given",
        verdict,
        backend,
    )
    printed = io.StringIO()
    with redirect_stdout(printed):
        args = ["explain", str(config), "--request", json.dumps(REQUEST), "--client", "agent"]
        assert policy_cli.main([*args, "--session", json.dumps(row), "--json"]) == 0
    cli = json.loads(printed.getvalue())["decision"]
    assert [v for v in cli["verdicts"] if v["rule"] == "session"] == [
        v for v in r.json()["decision"]["verdicts"] if v["rule"] == "session"
    ]


@pytest.mark.parametrize(
    ("row", "needle"),
    [({"engine": "a", "prefix": 1}, "prefix"), ({"engine": "a", "turns": -1}, "turns")],
)
async def test_a_bad_row_is_400_naming_the_field(setup, row, needle) -> None:
    _, client, _ = setup
    r = await _explain(client, session=row)
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]
