"""Real agents keep one engine per session through the demo while other traffic varies the load
(the headerless case by fingerprint is tests/relay/test_sessions_e2e.py).

The shipped demo runs one coding engine (policies/gb10.yaml's single winner), so this module runs
the demo on its three-variant policy (policies/demo-three.yaml), which routes by load (`deep-block-when-quiet`: coder-dflash7 while the route holds at
most two sequences, coder-dflash5 otherwise) and keeps sessions sticky; its backends state no
decode rate, so no move pays for itself. A session placed while quiet is on coder-dflash7; on the
turns where other sessions' streams keep the route busy the rule says coder-dflash5, and the
session stays, counted under the reason `session`.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import pytest

from tests.agents.demo import ROOT, Demo, start_demo, stop_demo
from tests.agents.recipes import recipes

pytestmark = pytest.mark.slow

PLACED = "coder-dflash7"  # where the rule puts a session that starts while the route is quiet
RULE = "deep-block-when-quiet"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """The demo on a policy with a load rule over two variants, so stickiness has a choice."""
    running = start_demo(
        Path(tmp_path_factory.mktemp("demo3")), policy=ROOT / "policies" / "demo-three.yaml"
    )
    try:
        yield running
    finally:
        stop_demo(running)


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached in time")


class Load:
    """Three long streams from other sessions while on: the route holds more than two sequences.
    `ignore_eos` with the route's largest `max_tokens` (minutes of decode): a stream outlasts any
    busy stretch here and ends only when switched off."""

    def __init__(self, demo: Demo) -> None:
        self.demo, self.stop, self.threads = demo, threading.Event(), list[threading.Thread]()

    def set(self, busy: bool) -> None:
        if busy and not self.threads:
            self._on()
        elif not busy and self.threads:
            self._off()

    def _in_flight(self) -> int:
        return int(self.demo.admin_get("/admin/status").json()["in_flight"])

    def _on(self) -> None:
        self.stop.clear()
        for i in range(3):
            t = threading.Thread(target=self._stream, args=(i,))
            t.start()
            self.threads.append(t)
        _wait(lambda: self._in_flight() >= 3)

    def _off(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=30)
        self.threads.clear()
        _wait(lambda: self._in_flight() == 0)

    def _stream(self, i: int) -> None:
        body = {
            "model": "coder",
            "stream": True,
            "max_tokens": 32768,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Other work {i}: refactor mod{i}."}],
        }
        with (
            self.demo.client() as c,
            c.stream(
                "POST",
                "/chat/completions",
                json=body,
                headers={"x-claude-code-session-id": f"other-{i}"},
            ) as r,
        ):
            for _ in r.iter_raw():
                if self.stop.is_set():
                    break


def test_anthropic_sdk_session_keeps_its_engine(demo: Demo) -> None:
    """As Claude Code sends it: its session header on every request, the conversation growing."""
    busy_turns = {2, 3, 4, 7, 8}
    load = Load(demo)
    messages: list[anthropic.types.MessageParam] = [
        {"role": "user", "content": "Fix the failing test in src/app.py."}
    ]
    served: list[tuple[str, str]] = []
    with anthropic.Anthropic(
        base_url=demo.base.removesuffix("/v1"),
        api_key=demo.key,
        default_headers={"x-claude-code-session-id": "0b5e6f1c-cc-session"},
        http_client=anthropic.DefaultHttpxClient(verify=ssl.create_default_context(cafile=demo.ca)),
        max_retries=0,
    ) as client:
        try:
            for turn in range(10):
                load.set(turn in busy_turns)
                raw = client.messages.with_raw_response.create(
                    model="coder",
                    max_tokens=64,
                    system="You are a coding agent.",
                    messages=messages,
                )
                served.append(
                    (raw.headers["x-specrouter-variant"], raw.headers["x-specrouter-reason"])
                )
                text = "".join(b.text for b in raw.parse().content if b.type == "text")
                messages += [
                    {"role": "assistant", "content": text or "ok"},
                    {"role": "user", "content": f"Now step {turn + 2}."},
                ]
        finally:
            load.set(False)
    assert {v for v, _ in served} == {PLACED}, served
    assert served[0][1] == RULE, served
    # on every busy turn the rule said coder-dflash5: the session stayed, by its reason
    assert all(served[t][1] == "session" for t in busy_turns), served


def _thread_id(jsonl: str) -> str:
    for line in jsonl.splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("type") == "thread.started":
                return str(event["thread_id"])
    raise AssertionError(f"no thread.started event in:\n{jsonl}")


def test_codex_thread_keeps_its_engine(demo: Demo, agents: Path, tmp_path: Path) -> None:
    """`codex exec` (two tool calls, then the answer), then `codex exec resume` of that thread:
    Codex sends the thread's id as `thread-id` and `session-id` on each of its requests."""
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    if not (bin_dir / "codex").exists():
        pytest.skip(f"codex is not installed in {bin_dir} (scripts/agents.sh)")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    config = recipes()["codex-config"].replace("https://127.0.0.1:8443/v1", demo.base)
    (home / "config.toml").write_text(config)
    env = {
        **demo.env(),
        "CODEX_HOME": str(home),
        "SSL_CERT_FILE": demo.ca,
        "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
    }
    first = ["exec", "--skip-git-repo-check", "--sandbox", "workspace-write", "--json"]
    resume = ["exec", "resume", "--skip-git-repo-check", "--json"]
    busy_runs = {1, 2, 5, 6}  # each resume is one request: the thread's answer to the new prompt
    busy_windows: list[tuple[float, float]] = []
    thread = ""
    load = Load(demo)
    since = time.time()
    try:
        for run in range(9):  # 3 requests, then 8 resumes of one request each
            load.set(run in busy_runs)
            args = [*first, "List files"] if run == 0 else [*resume, thread, f"Step {run}: again."]
            start = time.time()
            done = subprocess.run(
                ["codex", *args],
                cwd=work,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert done.returncode == 0, done.stdout + done.stderr
            if run == 0:
                thread = _thread_id(done.stdout)
            assert _thread_id(done.stdout) == thread
            if run in busy_runs:
                busy_windows.append((start, time.time()))
    finally:
        load.set(False)
    rows = [r for r in demo.rows(since) if r["agent"] == "codex"]
    assert len(rows) >= 10, [dict(r) for r in rows]
    assert len({r["session"] for r in rows}) == 1  # one thread, one session key
    assert {r["variant"] for r in rows} == {PLACED}, [(r["variant"], r["reason"]) for r in rows]
    assert rows[0]["reason"] == RULE
    kept = [r for r in rows if any(a <= r["time"] <= b for a, b in busy_windows)]
    assert len(kept) >= len(busy_runs)
    assert {r["reason"] for r in kept} == {"session"}, [dict(r) for r in kept]
