"""`specrouter demo` as a user starts it, on free ports in a temp state directory.

The demo policy's backend ports are rewritten to free ones (other test runs share loopback);
everything else is the shipped policies/demo.yaml (or, for tests that need several variants, the
`policy` given, e.g. policies/demo-three.yaml). The banner is parsed for what a user copies.
"""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import yaml

from loadtests.harness.ports import free_port
from proxy.ops.demo import DEMO_POLICY

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen3.8-27b"


def policy_on_free_ports(out: Path, source: Path = DEMO_POLICY) -> Path:
    doc = yaml.safe_load(source.read_text())
    for backend in doc["backends"].values():
        parts = urlsplit(backend["url"])
        backend["url"] = f"{parts.scheme}://127.0.0.1:{free_port()}"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


@dataclass
class Demo:
    proc: subprocess.Popen[str]
    state: Path
    banner: str
    port: int
    admin_port: int
    output: list[str] = field(default_factory=list)
    _marks: int = 0

    def value(self, label: str) -> str:
        match = re.search(rf"^  {label}\s+(\S+)", self.banner, re.M)
        assert match, f"{label!r} not in the banner:\n{self.banner}"
        return match.group(1)

    @property
    def base(self) -> str:
        return self.value("base URL")

    @property
    def ca(self) -> str:
        return self.value("CA file")

    @property
    def key(self) -> str:
        return self.value("client key")

    @property
    def admin_token(self) -> str:
        match = re.search(r"\(token: (\S+)\)", self.banner)
        assert match
        return match.group(1)

    def env(self) -> dict[str, str]:
        """What docs/clients.md's first recipe exports, for this demo."""
        return {
            **os.environ,
            "SPECROUTER_URL": self.base,
            "SPECROUTER_CA": self.ca,
            "SPECROUTER_KEY": self.key,
        }

    def rows(self, since: float) -> list[sqlite3.Row]:
        """Request-log rows of requests that arrived after `since`, once the writer has written
        every request that ended before this call: a marker request is sent, and its row read
        back (the log writes in batches every 0.5 s, in the order requests end)."""
        self._marks += 1
        mark = f"rows-mark-{self._marks}"
        with self.client() as c:
            r = c.post(
                "/chat/completions",
                json={
                    "model": MODEL,
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "."}],
                },
                headers={"x-request-id": mark},
            )
            assert r.status_code == 200, r.text
        deadline = time.monotonic() + 10
        while True:
            rows = self.rows_since(since)
            if any(r["request_id"] == mark for r in rows) or time.monotonic() > deadline:
                return [r for r in rows if not r["request_id"].startswith("rows-mark-")]
            time.sleep(0.05)

    def rows_since(self, since: float) -> list[sqlite3.Row]:
        """The rows written so far of requests that arrived after `since` (no waiting)."""
        conn = sqlite3.connect(self.state / "requests.sqlite3")
        conn.row_factory = sqlite3.Row
        try:
            return conn.execute(
                "SELECT * FROM requests WHERE time >= ? ORDER BY time", (since,)
            ).fetchall()
        except sqlite3.OperationalError:  # the table is made with the first batch
            return []
        finally:
            conn.close()

    def terminal(self) -> str:
        return "".join(self.output)

    def client(self) -> httpx.Client:
        """An httpx client on the base URL, trusting the demo's CA, with the client key."""
        return httpx.Client(
            base_url=self.base,
            verify=ssl.create_default_context(cafile=self.ca),
            headers={"authorization": f"Bearer {self.key}"},
            timeout=30,
        )

    def admin_get(self, path: str) -> httpx.Response:
        return httpx.get(
            f"http://127.0.0.1:{self.admin_port}{path}",
            headers={"authorization": f"Bearer {self.admin_token}"},
            timeout=10,
        )


def start_demo(
    tmp: Path, *, time_scale: float = 0.1, timeout: float = 60.0, policy: Path = DEMO_POLICY
) -> Demo:
    port, admin_port = free_port(), free_port()
    state = tmp / "state"
    # An admin token as the demo could write before it refused a leading "-" (one in 64 did):
    # the demo must still start with it (it once read it as an option and exited).
    state.mkdir(parents=True, exist_ok=True)
    if not (state / "admin.token").exists():
        (state / "admin.token").write_text("-" + secrets.token_urlsafe(24) + "\n")
    cmd = [
        sys.executable,
        "-m",
        "proxy.cli",
        "demo",
        "--state-dir",
        str(state),
        "--policy",
        str(policy_on_free_ports(tmp / "demo.yaml", policy)),
        "--listen",
        f"127.0.0.1:{port}",
        "--admin-listen",
        f"127.0.0.1:{admin_port}",
        "--time-scale",
        str(time_scale),
        "--access-log",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            proc.stdout.close()
            raise AssertionError("demo exited:\n" + "".join(lines))
        lines.append(line)
        if line.startswith("specrouter listening"):
            break
    demo = Demo(proc, state, "".join(lines), port, admin_port, lines)
    out = proc.stdout

    def drain() -> None:  # keep reading: a full pipe would block the gateway's logging
        for line in out:
            demo.output.append(line)

    threading.Thread(target=drain, daemon=True).start()
    try:
        wait_ready(demo, deadline)
    except BaseException:
        stop_demo(demo)
        raise
    return demo


def wait_ready(demo: Demo, deadline: float) -> None:
    url = f"https://127.0.0.1:{demo.port}/readyz"
    ctx = ssl.create_default_context(cafile=demo.ca)
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, verify=ctx, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError("demo never ready:\n" + demo.terminal())


def stop_demo(demo: Demo) -> None:
    demo.proc.terminate()
    try:
        demo.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        demo.proc.kill()
        demo.proc.wait()
    if demo.proc.stdout is not None:
        demo.proc.stdout.close()
