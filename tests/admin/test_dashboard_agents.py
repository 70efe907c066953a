"""The dashboard's per-agent rows and 15-minute charts in a real headless Chromium.

Two sessions of several turns each, with different agents' headers (Claude Code's and Codex's),
through the gateway to two simulated engines. Also makes docs/dashboard-sessions.png:

    PYTHONPATH=. .venv/bin/python -m tests.admin.test_dashboard_agents [docs/dashboard-sessions.png]
"""

from __future__ import annotations

import sys
import threading
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import make_local_ca
from tests.admin.test_dashboard import CHROMIUM, SERVED, open_dashboard

# name, its session header, the variant it is pinned to (so each variant draws a line)
AGENTS = (
    ("claude-code", "x-claude-code-session-id", "coder-dflash7"),
    ("codex", "thread-id", "coder-mtp3"),
)
# Long enough to fill the engines' prefix-cache blocks, so later turns report cached tokens.
SYSTEM = "You are a careful coding agent working in a Python repository. " * 20


def converse(gw: GatewayServer, agent: int, turns: int, max_tokens: int) -> None:
    """One session: `turns` chat turns, each sending the conversation so far."""
    name, header, variant = AGENTS[agent]
    headers = {header: f"{name}-session-{agent}", "x-specrouter-variant": variant}
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    with gw.client() as c:
        for turn in range(turns):
            messages.append({"role": "user", "content": f"Step {turn}: fix `lib/m{turn}.py`."})
            body = {"model": "coder", "stream": True, "max_tokens": max_tokens, "seed": turn}
            with c.stream(
                "POST", "/v1/chat/completions", json={**body, "messages": messages}, headers=headers
            ) as r:
                assert r.status_code == 200
                r.read()
            messages.append({"role": "assistant", "content": f"Done with step {turn}."})


def run_sessions(gw: GatewayServer, turns: int, max_tokens: int) -> None:
    threads = [
        threading.Thread(target=converse, args=(gw, i, turns, max_tokens))
        for i in range(len(AGENTS))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)


def start(stack: ExitStack, certs: Any, time_scale: float) -> GatewayServer:
    sims = {
        name: stack.enter_context(
            SimServer(
                profile,
                served_model_name=SERVED,
                time_scale=time_scale,
                spec_metrics="summary",
                extra_args=("--enable-prompt-tokens-details",),
            )
        )
        for name, profile in (("coder-dflash7", "dflash7-prob-block"), ("coder-mtp3", "mtp3"))
    }
    policy = coder_policy({name: sim.url for name, sim in sims.items()})
    return stack.enter_context(GatewayServer(policy, certs=certs, args=("--admin-tls",)))


def photograph(page: Any, path: Path) -> None:
    page.wait_for_function(
        "[...document.querySelectorAll('#charts-agents canvas')]"
        ".every((c) => Number(c.dataset.points) > 0) && "
        "document.querySelectorAll('#inflight tbody tr').length === 0",
        timeout=15_000,
    )
    page.screenshot(path=str(path), full_page=True)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by `make test`")
def test_agent_rows_and_charts_in_chromium(certs, artifacts: Path) -> None:
    from playwright.sync_api import sync_playwright

    with ExitStack() as stack:
        gw = start(stack, certs, time_scale=0.05)
        pw = stack.enter_context(sync_playwright())
        browser, page, _ = open_dashboard(pw, gw)
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        run_sessions(gw, turns=3, max_tokens=48)
        page.wait_for_function(
            "[...document.querySelectorAll('#agents tbody tr')]"
            ".filter((r) => r.innerText.includes('\\t3\\t')).length === 2",
            timeout=10_000,
        )
        rows = {
            r.split("\t")[1]: r.split("\t")
            for r in page.locator("#agents tbody tr").all_inner_texts()
        }
        assert set(rows) == {"claude-code", "codex"}
        for name, _, variant in AGENTS:
            cells = rows[name]
            assert cells[0].startswith("s-") and name not in cells[0]  # the hash, not the id
            assert cells[3] == variant and cells[4] == "3"  # stuck to its engine, 3 requests
            assert int(cells[5]) > 3 * 200 and int(cells[6]) > 0  # tokens in and out
            assert int(cells[7].split()[0]) > 0  # later turns hit the prefix cache
            assert cells[8] == "0"  # each turn extends the last: every whole block found
            assert cells[10] == "100%"  # the only session on its engine
        photograph(page, artifacts / "dashboard-sessions.png")
        for box in ("#charts-variants", "#charts-agents"):
            points = page.eval_on_selector_all(
                f"{box} canvas", "(cs) => cs.map((c) => Number(c.dataset.points))"
            )
            assert len(points) == 3 and all(p > 0 for p in points), (box, points)
        legend = page.inner_text("#charts-variants .legend")
        assert "coder-dflash7" in legend and "coder-mtp3" in legend
        assert errors == []
        browser.close()


def main(out: Path) -> None:
    """docs/dashboard.md's picture: more turns at a slower pace, so the charts span a few buckets."""
    import tempfile

    from playwright.sync_api import sync_playwright

    with ExitStack() as stack:
        certs = make_local_ca(Path(stack.enter_context(tempfile.TemporaryDirectory())))
        gw = start(stack, certs, time_scale=0.5)
        pw = stack.enter_context(sync_playwright())
        browser, page, _ = open_dashboard(pw, gw)
        run_sessions(gw, turns=12, max_tokens=256)
        photograph(page, out)
        browser.close()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard-sessions.png"))
