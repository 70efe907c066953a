"""docs/dashboard-agents.png: the dashboard under Codex, aider and Anthropic-SDK traffic.

    PYTHONPATH=. .venv/bin/python -m tests.agents.shot [docs/dashboard-agents.png]

Starts the demo, gives each agent its own client key (an edit of the demo's policy file, which
the gateway applies live) so the dashboard's client column tells them apart, runs the three as
docs/clients.md's recipes, then photographs the dashboard in headless Chromium.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from proxy import auth
from tests.agents.demo import ROOT, Demo, start_demo, stop_demo
from tests.agents.recipes import recipes, run_recipe

AGENTS = ("codex", "aider", "anthropic-sdk")


def give_keys(demo: Demo) -> dict[str, str]:
    policy = demo.state / "policy.yaml"
    doc = yaml.safe_load(policy.read_text())
    keys = {name: f"sk-demo-{name}-{int(time.time())}-0123456789abcdef" for name in AGENTS}
    doc["clients"] += [{"name": n, "key_sha256": auth.hash_key(k)} for n, k in keys.items()]
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    deadline = time.monotonic() + 20
    while "edited: applied" not in demo.terminal() and time.monotonic() < deadline:
        time.sleep(0.2)
    return keys


def drive(demo: Demo, keys: dict[str, str], tmp: Path, agents: Path) -> None:
    npm_bin, aider_bin = agents / "npm" / "node_modules" / ".bin", agents / "aider" / "bin"
    (tmp / ".venv").symlink_to(Path(sys.executable).parents[1])
    home = tmp / "codex-home"
    home.mkdir()
    config = recipes()["codex-config"].replace("https://127.0.0.1:8443/v1", demo.base)
    (home / "config.toml").write_text(config)
    (tmp / "hello.py").write_text("def hello():\n    return 'hi'\n")
    for _ in range(2):
        run_recipe(
            "codex",
            demo,
            tmp,
            extra_path=(npm_bin,),
            env={"CODEX_HOME": str(home), "SPECROUTER_KEY": keys["codex"]},
        )
        run_recipe(
            "aider",
            demo,
            tmp,
            extra_path=(aider_bin,),
            env={"HOME": str(tmp), "SPECROUTER_KEY": keys["aider"]},
        )
        # Streaming without tools: the simulator's /v1/messages refuses tools (test_anthropic.py).
        script = recipes()["anthropic-python"].replace("tools=[bash],", "")
        env = {**demo.env(), "SPECROUTER_KEY": keys["anthropic-sdk"]}
        subprocess.run(["bash", "-c", script], cwd=tmp, env=env, timeout=60, check=True)


def photograph(demo: Demo, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    admin = f"http://127.0.0.1:{demo.admin_port}"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
            ],
        )
        page = browser.new_page(viewport={"width": 1440, "height": 900})
        page.goto(f"{admin}/dashboard")
        page.fill("input[name=token]", demo.admin_token)
        page.click("button[type=submit]")
        page.wait_for_selector("#status.live", timeout=10_000)
        page.wait_for_function(
            "document.querySelectorAll('#recent tbody tr').length >= 6", timeout=20_000
        )
        time.sleep(2)
        page.screenshot(path=str(out), full_page=True)
        browser.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "dashboard-agents.png"
    agents = Path(
        subprocess.run(
            [str(ROOT / "scripts" / "agents.sh")], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
    )
    with tempfile.TemporaryDirectory() as tmp:
        demo = start_demo(Path(tmp), time_scale=0.5)
        try:
            keys = give_keys(demo)
            work = Path(tmp) / "work"
            work.mkdir()
            drive(demo, keys, work, agents)
            photograph(demo, out)
        finally:
            stop_demo(demo)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
