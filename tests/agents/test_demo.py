"""`specrouter demo` as a newcomer meets it: the banner's commands run as printed, the report finds
the demo's log, and the terminal shows backend transitions, refused policy files and requests."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.agents.demo import Demo, start_demo, stop_demo

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """A demo of its own: these tests edit its policy, fail an engine and count every request."""
    running = start_demo(Path(tmp_path_factory.mktemp("demo")))
    try:
        yield running
    finally:
        stop_demo(running)


def banner_commands(banner: str) -> list[str]:
    """The indented command blocks between 'Stream a completion:' and the docs pointer."""
    body = banner.split("Stream a completion:\n", 1)[1].split("\nCodex and Claude Code", 1)[0]
    blocks = [b.split(":\n", 1)[1] if not b.startswith("  ") else b for b in body.split("\n\n")]
    # Copied as printed: the shell ignores the first line's indent, the rest is kept verbatim.
    return [b.lstrip() for b in blocks if b.strip()]


def wait_for(check: Callable[[], bool], what: str, demo: Demo, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise AssertionError(f"no {what} in the terminal:\n{demo.terminal()[-3000:]}")


def test_banner_commands_run_as_printed(demo: Demo) -> None:
    """In a shell whose PATH has no `specrouter` until the banner's first line puts it there."""
    curl, python, report = banner_commands(demo.banner)
    activate = demo.banner.split("on PATH:\n", 1)[1].splitlines()[0].strip()
    assert curl.startswith("curl ") and report.startswith("specrouter report ")
    assert "simulated GB10" in demo.banner and "scripts the tool calls" in demo.banner
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    env.pop("VIRTUAL_ENV", None)

    def run(command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", f"{activate} && {command}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    for command in (curl, python):
        done = run(command)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip()
    # The two requests' rows, which the request log writes in batches: what the report reads.
    wait_for(lambda: len(demo.rows_since(0)) >= 2, "two request-log rows", demo)
    done = run(report)
    assert done.returncode == 0, done.stderr
    assert "2 requests, 2 ok" in done.stdout and "variant=coder-" in done.stdout


def test_access_log_has_one_line_per_request_without_content(demo: Demo) -> None:
    body = {
        "model": "coder",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "secret-prompt-words"}],
    }
    resp = httpx.post(
        demo.base + "/chat/completions",
        json=body,
        verify=_ctx(demo),
        headers={"authorization": f"Bearer {demo.key}", "x-request-id": "acc-1"},
    )
    assert resp.status_code == 200
    wait_for(lambda: "acc-1 client=demo-agent chat " in demo.terminal(), "access line", demo)
    line = next(x for x in demo.terminal().splitlines() if "acc-1 client=demo-agent" in x)
    assert "status=200 outcome=ok" in line and "tokens=" in line
    assert "secret-prompt-words" not in demo.terminal()


def test_terminal_shows_backend_down_and_up(demo: Demo) -> None:
    url = re.search(r"coder-dflash7\s+dflash7-prob-block\s+(\S+)", demo.banner)
    assert url
    httpx.post(url.group(1) + "/_sim/faults", json={"mode": "health_fail"}).raise_for_status()
    try:
        # Within its startup window a failing engine is "starting" (still loading), then "down".
        wait_for(
            lambda: (
                re.search(r"backend coder-dflash7 is (down|starting) \(was up\)", demo.terminal())
                is not None
            ),
            "down",
            demo,
        )
    finally:
        httpx.delete(url.group(1) + "/_sim/faults").raise_for_status()
    wait_for(
        lambda: (
            re.search(r"backend coder-dflash7 is up \(was (down|starting)\)", demo.terminal())
            is not None
        ),
        "up",
        demo,
    )


def test_terminal_shows_a_refused_policy_file(demo: Demo) -> None:
    policy = demo.state / "policy.yaml"
    good = policy.read_bytes()
    policy.write_text("schema: 1\nbackends: {}\nroutes: nonsense\n")
    try:
        wait_for(
            lambda: f"edited policy file {policy} refused" in demo.terminal(),
            "refused policy file",
            demo,
        )
    finally:
        policy.write_bytes(good)


def _ctx(demo: Demo) -> object:
    import ssl

    return ssl.create_default_context(cafile=demo.ca)
