"""Claude Code through the gateway against an engine silent for longer than its 300 s event
watchdog, pings on: did it resend, when, and did the turn finish (docs/clients.md, "What the
agents' watchdogs count").

    python -m loadtests.bench.claude_wait [--wait 330] [--keepalive 15] [--out FILE]

A simulator (the demo's engine: tool-call and reasoning parsers as gb10.yaml) behind the real
gateway (TLS, `keepalive_s` on the route); the simulator's `hang` fault holds every request
silent, after its response head, from before the agent starts until `--wait` seconds after the
first request reached it, then lets it answer. The agent is the pinned Claude Code from the
agents' cache (scripts/agents.sh), `claude -p` as docs/clients.md's recipe runs it, in an empty
HOME; `--agent` runs another command (the smoke test's stand-in when the binary is absent).
Recorded: each request's arrival at the engine (the simulator's count, polled), the gateway's
request-log rows, the agent's exit status, output and time.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

MODEL = "qwen3.8-27b"
PROMPT = "List the files here"
COLUMNS = "time, request_id, agent, request_class, outcome, finish_reason, ttft_s, e2e_s"


def claude_binary() -> Path:
    """Where scripts/agents.sh installs Claude Code (SPECROUTER_AGENTS_DIR overrides it)."""
    cache = os.environ.get("SPECROUTER_AGENTS_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specrouter" / "agents"
    )
    return Path(cache) / "npm" / "node_modules" / ".bin" / "claude"


def claude_version(binary: Path) -> str | None:
    """The installed package's version (package.json beside the binary's package), if any."""
    package = binary.parent.parent / "@anthropic-ai" / "claude-code" / "package.json"
    return str(json.loads(package.read_text())["version"]) if package.exists() else None


def log_rows(state: Path) -> list[dict[str, Any]]:
    """Every request-log row so far (the log writes in batches: call after the batch interval)."""
    conn = sqlite3.connect(state / "requests.sqlite3")
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(f"SELECT {COLUMNS} FROM requests ORDER BY time")]
    except sqlite3.OperationalError:  # no batch written yet
        return []
    finally:
        conn.close()


def run(
    agent: list[str], *, wait: float, keepalive: float, first_byte: float, finish_timeout: float
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="claude-wait-") as tmp,
        SimServer(
            served_model_name=MODEL,
            tool_call_parser="qwen3_coder",
            reasoning_parser="qwen3",
            time_scale=0.05,
        ) as sim,
    ):
        policy = coder_policy({"coder-dflash7": sim.url})
        if keepalive > 0:  # 0: the route sends no pings
            policy["routes"]["coder"]["keepalive_s"] = keepalive
        # The gateway's own first-byte timeout past the silence: only the agent's clocks cut.
        with GatewayServer(
            policy, args=("--first-byte-timeout", str(first_byte), "--access-log")
        ) as gw:
            home, work = Path(tmp) / "home", Path(tmp) / "work"
            home.mkdir()
            work.mkdir()
            (work / "notes.txt").write_text("hello\n")
            env = {
                **os.environ,
                "HOME": str(home),
                "NODE_EXTRA_CA_CERTS": str(gw.certs.ca_cert),
                "SSL_CERT_FILE": str(gw.certs.ca_cert),
                "ANTHROPIC_BASE_URL": gw.base,
                "ANTHROPIC_API_KEY": CLIENT_KEY,
                "ANTHROPIC_MODEL": MODEL,
            }
            sim.fault("hang")
            wall0, t0 = time.time(), time.monotonic()
            proc = subprocess.Popen(
                agent,
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            arrivals: list[float] = []  # seconds after the agent's start
            cleared_at: float | None = None
            try:
                seen = sim.stats()["requests"]
                while proc.poll() is None:
                    now = time.monotonic() - t0
                    count = sim.stats()["requests"]
                    arrivals += [round(now, 1)] * (count - seen)
                    seen = count
                    if cleared_at is None and arrivals and now >= arrivals[0] + wait:
                        sim.clear_faults()
                        cleared_at = round(now, 1)
                    if now > (arrivals[0] if arrivals else 0) + wait + finish_timeout:
                        break
                    time.sleep(0.25)
                if proc.poll() is None:
                    proc.kill()
                out, _ = proc.communicate()
                ended = round(time.monotonic() - t0, 1)
                arrivals += [ended] * (sim.stats()["requests"] - seen)
            finally:
                sim.clear_faults()
                if proc.poll() is None:
                    proc.kill()
                    proc.communicate()
            time.sleep(1.5)  # the request log's last batch (written every 0.5 s)
            rows = log_rows(gw.dir / "state")
            gateway_lines = [line.rstrip() for line in gw.output][-40:]
    for row in rows:
        row["time"] = round(row.pop("time") - wall0, 1)
    return {
        "agent": agent,
        "claude_code": claude_version(Path(agent[0])),
        "wait_s": wait,
        "keepalive_s": keepalive,
        "gateway_first_byte_timeout_s": first_byte,
        "engine_requests": len(arrivals),
        "engine_arrivals_s": arrivals,
        "fault_cleared_s": cleared_at,
        "agent_exit": proc.returncode,
        "agent_ended_s": ended,
        "agent_output_tail": out[-2000:],
        "gateway_rows": rows,
        "gateway_output_tail": gateway_lines,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wait", type=float, default=330.0, help="engine silence, seconds")
    p.add_argument("--keepalive", type=float, default=15.0, help="the route's keepalive_s (0: off)")
    p.add_argument("--first-byte-timeout", type=float, default=900.0, help="the gateway's")
    p.add_argument("--finish-timeout", type=float, default=300.0, help="after the silence")
    p.add_argument("--out", type=Path, help="also write the result here (JSON)")
    p.add_argument(
        "--agent", nargs=argparse.REMAINDER, help="last: another agent command and its arguments"
    )
    args = p.parse_args(argv)
    agent = args.agent or [str(claude_binary()), "-p", PROMPT]
    if not Path(agent[0]).exists() and args.agent is None:
        print(f"{agent[0]} is missing: run scripts/agents.sh", file=sys.stderr)
        return 2
    result = run(
        agent,
        wait=args.wait,
        keepalive=args.keepalive,
        first_byte=args.first_byte_timeout,
        finish_timeout=args.finish_timeout,
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
