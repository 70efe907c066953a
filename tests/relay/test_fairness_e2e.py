"""Fairness end to end (policies/fairness.py): the `priority` a real gateway sends a simulated
vLLM running `--scheduling-policy priority` follows the client's priority, the session's
attained service (counted by the gateway from what each request used) and the request's class;
with fairness off, the client's own priority again. The admin explain says the same, and why."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
# Small boundaries so a few short turns cross them: level 1 below 300 attained tokens, 2 below
# 3,000, 3 from there.
FAIRNESS = {"enabled": True, "boundaries": [300, 3000]}
WORDS = " ".join(f"word{i} and code{i}();" for i in range(400))  # ~2,400 tokens


def _policy(sim_url: str, fairness: dict[str, Any]) -> dict[str, Any]:
    doc = coder_policy({"coder-a": sim_url}, served=SERVED, defaults={})
    doc["backends"]["coder-a"]["priority_scheduling"] = True
    doc["clients"][1]["priority"] = 1  # "other": after every session of "agent"
    doc["fairness"] = fairness
    return doc


@pytest.fixture(scope="module")
def stack(certs: Any) -> Iterator[tuple[GatewayServer, SimServer]]:
    sim_args = ("--scheduling-policy", "priority")
    with SimServer("mtp3", served_model_name=SERVED, time_scale=0.02, extra_args=sim_args) as sim:
        with GatewayServer(_policy(sim.url, FAIRNESS), certs=certs) as gw:
            yield gw, sim


def _turn(
    stack: tuple[GatewayServer, SimServer],
    session: str,
    text: str,
    *,
    key: str | None = None,
    **headers: str,
) -> int | None:
    """One streamed turn of `session`; the priority the simulator saw for it."""
    gw, sim = stack
    rid = f"fair-{time.monotonic_ns()}"
    body = {
        "model": "coder",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "max_tokens": 8,
    }
    hdrs = {"x-claude-code-session-id": session, "x-request-id": rid, **headers}
    with gw.client(**({"key": key} if key else {})) as c:
        r = c.post("/v1/chat/completions", json=body, headers=hdrs)
        assert r.status_code == 200, r.text
    seen = httpx.get(f"{sim.url}/_sim/priorities", timeout=5).json()
    return next(v for k, v in seen.items() if k.endswith(rid))


def _explain(gw: GatewayServer, session: str) -> dict[str, Any]:
    r = httpx.post(
        gw.admin + "/admin/policy/explain",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        json={
            "request": {"model": "coder", "messages": [{"role": "user", "content": "next"}]},
            "headers": {"x-claude-code-session-id": session},
        },
        timeout=10,
    )
    assert r.status_code == 200, r.text
    return dict(r.json())


def _until_attained(gw: GatewayServer, session: str, at_least: int) -> dict[str, Any]:
    """The gateway counts a request's tokens when its record is finished, just after the
    client's last byte: wait for the table (the admin explain reads it) to have them."""
    end = time.monotonic() + 10
    while True:
        out = _explain(gw, session)
        if out["session"]["attained_tokens"] >= at_least or time.monotonic() > end:
            return out
        time.sleep(0.05)


def test_priority_follows_attained_service_class_and_client(stack) -> None:
    gw, sim = stack
    # A fresh session: level 1.
    assert _turn(stack, "long", "hello") == 1
    # Past 300 attained tokens (a ~2,400-token prompt): level 2, then past 3,000: level 3.
    _until_attained(gw, "long", 1)
    assert _turn(stack, "long", WORDS) == 1  # its attained service is counted after the turn
    out = _until_attained(gw, "long", 300)
    assert out["decision"]["priority"] == 2
    why = next(v for v in out["decision"]["verdicts"] if v["rule"] == "fairness")
    assert "attained" in why["detail"] and "level 2" in why["detail"], why
    assert _turn(stack, "long", WORDS + " again " + WORDS) == 2
    _until_attained(gw, "long", 3000)
    assert _turn(stack, "long", "short") == 3
    # A short session is not behind it: level 1.
    assert _turn(stack, "short", "hi") == 1
    # Classes: compaction has its own level (1), a subagent its own (4).
    compaction = {"x-claude-code-request-class": "compaction"}
    assert _turn(stack, "long", "summarise", **compaction) == 1
    subagent = {"x-claude-code-agent-id": "a1", "x-claude-code-parent-agent-id": "main"}
    assert _turn(stack, "long", "explore", **subagent) == 4
    # The client's priority first: "other" (priority 1) comes after every level of "agent".
    assert _turn(stack, "fresh-other", "hi", key=OTHER_KEY) == 1 * 8 + 1
    # Fairness off: the client's own priority, whatever the session attained.
    gw.write_policy(_policy(sim.url, {"enabled": False}))
    gw.hup()
    end = time.monotonic() + 10
    while _explain(gw, "long")["decision"]["priority"] != 0 and time.monotonic() < end:
        time.sleep(0.1)
    assert _turn(stack, "long", "after") == 0
    assert _turn(stack, "fresh-other", "hi", key=OTHER_KEY) == 1
