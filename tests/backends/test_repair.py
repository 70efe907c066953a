"""Health states and guarded repair, with a real command that restarts a simulated engine."""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

RESTART_SIM = Path(__file__).resolve().parents[2] / "loadtests" / "harness" / "restart_sim.py"


def _wait(predicate, timeout: float = 20.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not reached in time")


def _health(gw: GatewayServer, name: str) -> str:
    snap = gw.admin_get("/dashboard/snapshot").json()
    return next(b["health"] for b in snap["backends"] if b["name"] == name)


STARTUP_S = 5  # the startup window: longer than a simulated engine's restart on a loaded box


def _until(deadline: float) -> None:
    """Sleep to `deadline` (monotonic): a window whose end nothing else shows."""
    time.sleep(max(0.0, deadline - time.monotonic()))


def test_repair_restarts_a_dead_backend_within_limits(certs, tmp_path) -> None:
    pidfile = tmp_path / "pids"
    with (
        SimServer("dflash7-prob-block", served_model_name="qwen3.8-27b", time_scale=0.02) as deep,
        SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as shallow,
    ):
        port = str(urlsplit(deep.url).port)
        policy = coder_policy({"deep": deep.url, "shallow": shallow.url})
        policy["backends"]["deep"].update(
            {
                "startup_s": STARTUP_S,
                "repair": {"action": "restart-deep", "after_down_s": 0.5, "max_per_hour": 2},
            }
        )
        # The command is the operator's (a server-side file); the policy only names it.
        operator = {
            "actions": {
                "restart-deep": {
                    "command": [
                        sys.executable,
                        str(RESTART_SIM),
                        port,
                        str(pidfile),
                        "dflash7-prob-block",
                    ]
                }
            }
        }
        policy["health"] = {"fail_after": 2, "recover_after": 1}
        try:
            with GatewayServer(policy, certs=certs, operator=operator) as gw:
                _wait(lambda: _health(gw, "deep") == "up")
                time.sleep(STARTUP_S)  # past the boot window: a failure now means "down"
                statuses: Counter[int] = Counter()
                stop = threading.Event()

                def traffic() -> None:
                    with gw.client() as c:
                        while not stop.is_set():
                            r = c.post(
                                "/v1/chat/completions",
                                json={
                                    "model": "coder",
                                    "max_tokens": 4,
                                    "messages": [{"role": "user", "content": "x"}],
                                },
                            )
                            statuses[r.status_code] += 1

                t = threading.Thread(target=traffic)
                t.start()
                deep.kill()  # outage 1: repaired
                # The repair's window opened before its command wrote the pid seen here.
                _wait(lambda: _count(pidfile) == 1)
                repaired = time.monotonic()
                _wait(lambda: _health(gw, "deep") == "up")
                _until(repaired + STARTUP_S + 0.5)  # out of the post-repair startup window
                _kill_pids(pidfile)  # outage 2: repaired again
                _wait(lambda: _count(pidfile) == 2)
                repaired = time.monotonic()
                _wait(lambda: _health(gw, "deep") == "up")
                _until(repaired + STARTUP_S + 0.5)
                _kill_pids(pidfile)  # outage 3
                # Two repairs per hour at most: the third outage stays down.
                _wait(lambda: _health(gw, "deep") == "down")
                time.sleep(1.5)
                assert _count(pidfile) == 2
                stop.set()
                t.join(timeout=30)
                assert set(statuses) == {200}, statuses  # the fallback served meanwhile
                metrics = gw.metrics()
                assert re.search(
                    r'specrouter_repairs_total\{backend="deep",result="ok"\} 2', metrics
                )
                snap = gw.admin_get("/dashboard/snapshot").json()
                assert [r["result"] for r in snap["repairs"]] == ["ok", "ok"]
        finally:
            _kill_pids(pidfile)


def _count(pidfile: Path) -> int:
    return len(pidfile.read_text().split()) if pidfile.exists() else 0


def _kill_pids(pidfile: Path) -> None:
    if not pidfile.exists():
        return
    for pid in pidfile.read_text().split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_cold_start_reads_as_starting_not_down(certs) -> None:
    with SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim:
        # Cold until the test ends it (60 s at this time scale): a window of a few seconds
        # could close before a gateway started in a loaded run first looked.
        sim.fault("cold_start", seconds=3000)
        policy = coder_policy({"a": sim.url})
        policy["backends"]["a"]["startup_s"] = 60
        with GatewayServer(policy, certs=certs) as gw:
            _wait(lambda: _health(gw, "a") == "starting", timeout=10)
            with gw.client() as c:
                r = c.get("/readyz")
            assert r.status_code == 503
            sim.clear_faults()  # the engine has loaded
            _wait(lambda: _health(gw, "a") == "up", timeout=20)
