"""What the live agent tests share: the gateway's request log, an agent's environment."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer

# What the trained model says (scripts/vllm_agent_model.py): the agents' own output shows it.
ANSWER = "Done: the command printed ok."
TASK = "Run echo ok"


def rows(gw: GatewayServer, since: float, count: int, timeout: float = 10.0) -> list[sqlite3.Row]:
    """The request-log rows of requests that arrived after `since`, once `count` are written
    (the log writes in batches)."""
    db = gw.dir / "state" / "requests.sqlite3"
    deadline = time.monotonic() + timeout
    found: list[sqlite3.Row] = []
    while time.monotonic() < deadline:
        if db.exists():
            conn = sqlite3.connect(db)
            conn.row_factory = sqlite3.Row
            try:
                found = conn.execute(
                    "SELECT * FROM requests WHERE time >= ? ORDER BY time", (since,)
                ).fetchall()
            except sqlite3.OperationalError:  # no table yet
                found = []
            finally:
                conn.close()
            if len(found) >= count:
                return found
        time.sleep(0.2)
    return found


def agent_env(gw: GatewayServer, home: Path, *bins: Path) -> dict[str, str]:
    """The client side of docs/clients.md for this gateway, HOME in the test's temp dir."""
    ca = str(gw.certs.ca_cert)
    env = {
        **os.environ,
        "HOME": str(home),
        "SSL_CERT_FILE": ca,
        "NODE_EXTRA_CA_CERTS": ca,
        "SPECROUTER_KEY": CLIENT_KEY,
        "ANTHROPIC_BASE_URL": gw.base,
        "ANTHROPIC_API_KEY": CLIENT_KEY,
    }
    env["PATH"] = os.pathsep.join([*map(str, bins), env["PATH"]])
    return env


def summary(found: list[sqlite3.Row]) -> str:
    """One line per request (prompt tokens, TTFT = the prefill, completion tokens, outcome), for
    the test's output and docs/real-vllm.md."""
    return "\n".join(
        f"  {r['prompt_tokens']} prompt tokens ({r['cached_tokens']} cached), "
        f"TTFT {r['ttft_s']:.2f} s, {r['completion_tokens']} completion tokens, "
        f"e2e {r['e2e_s']:.2f} s, {r['finish_reason']}, {r['outcome']}"
        for r in found
        if r["ttft_s"] is not None
    )
