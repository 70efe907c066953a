"""The real Codex, and the OpenAI SDK on chat, against an engine silent before its first output,
each with a short clock and no retries: the turn completes only if the gateway's pings reach
the clock the client keeps. Codex's `stream_idle_timeout_ms` counts SSE *events* (its parser
drops comments); the SDK's read timeout counts bytes. docs/clients.md, "What the agents'
watchdogs count".

The engine (the demo's simulator) sends Responses' `response.created` and
`response.in_progress` at once, as vLLM does, then nothing until the `hang` fault is cleared:
a cold prefill or a queue.
"""

from __future__ import annotations

import re
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.agents.demo import Demo, start_demo, stop_demo
from tests.agents.recipes import recipes

pytestmark = pytest.mark.slow

IDLE_MS = 3000  # Codex's stream_idle_timeout_ms here (its default is 300 s)
PING_S = 0.5  # the route's keepalive_s when pings are on


@pytest.fixture(scope="module")
def silent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A demo of its own: the hang stops its only engine, and the tests edit its policy."""
    running = start_demo(Path(tmp_path_factory.mktemp("demo")))
    try:
        yield running
    finally:
        stop_demo(running)


def sim_url(demo: Demo) -> str:
    match = re.search(r"coder-dflash7\s+dflash7-prob-block\s+(\S+)", demo.banner)
    assert match, demo.banner
    return match.group(1)


def set_keepalive(demo: Demo, every: float | None) -> None:
    """Edit the running demo's policy file and wait until the gateway has applied it."""
    policy = demo.state / "policy.yaml"
    doc = yaml.safe_load(policy.read_text())
    route = doc["routes"]["coder"]
    if route.get("keepalive_s") == every:
        return
    if every is None:
        route.pop("keepalive_s", None)
    else:
        route["keepalive_s"] = every
    applied = demo.terminal().count("edited: applied version")
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    deadline = time.monotonic() + 30
    while demo.terminal().count("edited: applied version") == applied:
        assert time.monotonic() < deadline, demo.terminal()[-3000:]
        time.sleep(0.1)


def engine_requests(sim: str) -> int:
    return int(httpx.get(sim + "/_sim/stats", timeout=10).json()["requests"])


@pytest.mark.parametrize(
    "pings",
    [
        pytest.param(True, id="pings-on"),
        pytest.param(False, id="pings-off"),
    ],
)
def test_codex_turn_survives_a_silent_engine_only_with_pings(
    silent: Demo, agents: Path, tmp_path: Path, pings: bool
) -> None:
    bin_dir = agents / "npm" / "node_modules" / ".bin"
    if not (bin_dir / "codex").exists():
        pytest.skip(f"codex is not installed in {bin_dir} (scripts/agents.sh)")
    set_keepalive(silent, PING_S if pings else None)
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (work / "notes.txt").write_text("hello\n")
    # docs/clients.md's provider, impatient: a short idle timeout and no second chance.
    config = recipes()["codex-config"].replace("https://127.0.0.1:8443/v1", silent.base)
    config += (
        f"stream_idle_timeout_ms = {IDLE_MS}\nrequest_max_retries = 0\nstream_max_retries = 0\n"
    )
    (home / "config.toml").write_text(config)
    sim = sim_url(silent)
    before = engine_requests(sim)
    httpx.post(sim + "/_sim/faults", json={"mode": "hang"}, timeout=10).raise_for_status()
    env = {
        **silent.env(),
        "CODEX_HOME": str(home),
        "PATH": f"{bin_dir}:{silent.env()['PATH']}",
    }
    proc = subprocess.Popen(
        ["bash", "-c", recipes()["codex"]],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while engine_requests(sim) == before:  # Codex's first request is at the engine
            assert proc.poll() is None and time.monotonic() < deadline, "no request reached it"
            time.sleep(0.1)
        # The engine stays silent for 2.5x Codex's idle timeout, then answers.
        try:
            proc.wait(timeout=IDLE_MS / 1000 * 2.5)
        except subprocess.TimeoutExpired:
            pass
        httpx.delete(sim + "/_sim/faults", timeout=10).raise_for_status()
        out, _ = proc.communicate(timeout=60)
    finally:
        httpx.delete(sim + "/_sim/faults", timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if pings:  # the pings were counted: the turn waited for the engine and completed
        assert proc.returncode == 0, out
        assert out.count("succeeded in") >= 1, out
    else:  # nothing Codex counts came: it gave up on the silent stream and sent nothing again
        assert proc.returncode != 0, out
        assert "idle timeout" in out, out
        assert engine_requests(sim) == before + 1, out


@pytest.mark.parametrize("pings", [True, False], ids=["pings-on", "pings-off"])
def test_openai_sdk_chat_survives_a_silent_engine_only_with_pings(
    silent: Demo, pings: bool
) -> None:
    """The chat side: the OpenAI SDK's read timeout counts bytes, so the comment pings hold it."""
    set_keepalive(silent, PING_S if pings else None)
    sim = sim_url(silent)
    client = openai.OpenAI(
        base_url=silent.base,
        api_key=silent.key,
        timeout=IDLE_MS / 1000,  # httpx's read timeout: between bytes, the head included
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=silent.ca)),
    )
    before = engine_requests(sim)
    httpx.post(sim + "/_sim/faults", json={"mode": "hang"}, timeout=10).raise_for_status()
    try:

        def turn() -> str:
            stream = client.chat.completions.create(
                model="qwen3.8-27b",
                stream=True,
                max_tokens=16,
                messages=[{"role": "user", "content": "Hi"}],
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        out: list[str | BaseException] = []

        def run() -> None:
            try:
                out.append(turn())
            except BaseException as err:  # noqa: BLE001 - reported below
                out.append(err)

        worker = threading.Thread(target=run)
        worker.start()
        deadline = time.monotonic() + 30
        while engine_requests(sim) == before:
            assert time.monotonic() < deadline, "no request reached the engine"
            time.sleep(0.05)
        worker.join(timeout=IDLE_MS / 1000 * 2.5)
        httpx.delete(sim + "/_sim/faults", timeout=10).raise_for_status()
        worker.join(timeout=60)
    finally:
        httpx.delete(sim + "/_sim/faults", timeout=10)
        client.close()
    [result] = out
    if pings:
        assert isinstance(result, str) and result, result
    else:
        assert isinstance(result, openai.APITimeoutError), repr(result)
