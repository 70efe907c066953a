"""The gateway's events (backend down / up, refused policy files) on /admin/status and on the
dashboard's snapshot, with a real gateway and a real simulated engine killed and restarted."""

from __future__ import annotations

import time
from typing import Any

import orjson

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.admin.dashboard import encoded
from proxy.observe.events import MAX_DETAIL, MAX_EVENTS, EventLog

SERVED = "qwen3.8-27b"


def _wait_events(gw: GatewayServer, predicate: Any, timeout: float = 20.0) -> list[dict[str, Any]]:
    end = time.monotonic() + timeout
    events: list[dict[str, Any]] = []
    while time.monotonic() < end:
        events = gw.admin_get("/admin/status").json()["events"]
        if predicate(events):
            return events
        time.sleep(0.1)
    raise AssertionError(f"events not reached in time: {events}")


def _kinds(events: list[dict[str, Any]], backend: str) -> list[str]:
    return [e["kind"] for e in events if e["backend"] == backend]


def test_backend_down_and_up_are_events_on_status_and_dashboard(certs) -> None:
    with SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as sim:
        policy = coder_policy({"a": sim.url})
        policy["backends"]["a"]["startup_s"] = 0  # a failed check means "down" at once
        policy["health"] = {"fail_after": 1, "recover_after": 1}
        with GatewayServer(policy, certs=certs) as gw:
            _wait_events(gw, lambda ev: "backend_up" in _kinds(ev, "a"))
            sim.kill()
            _wait_events(gw, lambda ev: _kinds(ev, "a")[-1:] == ["backend_down"])
            sim.restart()
            events = _wait_events(gw, lambda ev: _kinds(ev, "a")[-1:] == ["backend_up"])
            kinds = _kinds(events, "a")
            assert kinds[kinds.index("backend_down") :] == ["backend_down", "backend_up"]
            down = next(e for e in events if e["kind"] == "backend_down")
            assert down["detail"] == "was up" and down["time"] > time.time() - 60
            # The dashboard's snapshot carries the same events, newest first.
            snap = gw.admin_get("/dashboard/snapshot").json()
            shown = [(e["kind"], e["backend"]) for e in snap["events"]]
            assert shown[:2] == [("backend_up", "a"), ("backend_down", "a")]


def test_a_refused_policy_file_is_an_event(certs) -> None:
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs) as gw,
    ):
        version = gw.admin_get("/admin/status").json()["policy_version"]
        gw.policy_path.write_text("schema: 1\nbackends: {}\nroutes: [not, a, mapping]\n")
        gw.hup()
        events = _wait_events(gw, lambda ev: any(e["kind"] == "policy_refused" for e in ev))
        refused = next(e for e in events if e["kind"] == "policy_refused")
        assert refused["version"] == version and "refused" in refused["detail"]
        assert gw.admin_get("/admin/status").json()["policy_version"] == version
        snap = gw.admin_get("/dashboard/snapshot").json()
        assert any(e["kind"] == "policy_refused" for e in snap["events"])


def test_the_event_log_is_bounded() -> None:
    log = EventLog()
    for i in range(MAX_EVENTS * 3):
        log.add("policy_refused", version=f"v{i}", detail="x" * 100_000)
    rows = log.rows()
    assert len(rows) == MAX_EVENTS and rows[-1]["version"] == f"v{MAX_EVENTS * 3 - 1}"
    assert all(len(r["detail"]) == MAX_DETAIL for r in rows)
    # Within the dashboard's limit, whatever else the snapshot holds.
    snap: dict[str, Any] = {
        "time": 0.0,
        "policy": {"version": "v", "history": []},
        **{k: [] for k in ("in_flight", "recent", "variants", "backends", "repairs")},
        "events": rows[::-1],
    }
    assert len(orjson.dumps(snap)) < 256 * 1024
    small = orjson.loads(encoded(snap, 8 * 1024))
    assert small["truncated"] and small["events"][0]["version"] == rows[-1]["version"]
