"""The live dashboard in a real headless Chromium, with real streams through the gateway."""

from __future__ import annotations

import ssl
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from tests.admin.browser import CHROMIUM, launch

SERVED = "qwen3.8-27b"


def open_dashboard(pw: Any, gw: GatewayServer) -> tuple[Any, Any, list[str]]:
    """Headless Chromium logged in to `gw`'s dashboard, live: (browser, page, URLs requested)."""
    browser = launch(pw)
    page = browser.new_page(viewport={"width": 1440, "height": 900}, ignore_https_errors=True)
    urls: list[str] = []
    page.on("request", lambda req: urls.append(req.url))
    page.goto(f"{gw.admin}/dashboard")
    page.fill("input[name=token]", ADMIN_TOKEN)
    page.click("button[type=submit]")  # a POST: the token is in the body only
    page.wait_for_selector("#status.live", timeout=10_000)
    assert page.url == f"{gw.admin}/dashboard"
    return browser, page, urls


def test_snapshot_needs_a_token(certs) -> None:
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs) as gw,
    ):
        assert httpx.get(gw.admin + "/dashboard/snapshot").status_code == 401
        assert httpx.get(gw.admin + "/dashboard").status_code == 401
        snap = gw.admin_get("/dashboard/snapshot").json()
        assert [b["name"] for b in snap["backends"]] == ["a"]
        assert snap["policy"]["version"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by `make test`")
def test_dashboard_shows_requests_live_in_chromium(certs, artifacts: Path) -> None:
    from playwright.sync_api import sync_playwright

    with (
        SimServer(
            "dflash7-prob-block", served_model_name=SERVED, time_scale=0.25, spec_metrics="summary"
        ) as sim,
        GatewayServer(
            coder_policy({"coder-dflash7": sim.url}), certs=certs, args=("--admin-tls",)
        ) as gw,
        sync_playwright() as pw,
    ):
        browser, page, urls = open_dashboard(pw, gw)
        [cookie] = page.context.cookies()
        assert cookie["httpOnly"] and cookie["secure"] and cookie["sameSite"] == "Strict"
        assert cookie["expires"] > 0 and cookie["path"] == "/dashboard"
        assert ADMIN_TOKEN not in cookie["value"] and len(cookie["value"]) >= 32
        # From here on the page must not log errors (the login form itself was a 401).
        errors: list[str] = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        def stream(i: int) -> None:
            with (
                gw.client() as c,
                c.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={
                        "model": "coder",
                        "stream": True,
                        "max_tokens": 160,
                        "seed": i,
                        "messages": [{"role": "user", "content": f"Refactor `lib/m{i}.py`."}],
                    },
                ) as r,
            ):
                r.read()

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        # In flight first, with the variant that serves them...
        page.wait_for_function(
            "document.querySelectorAll('#inflight tbody tr').length >= 1", timeout=10_000
        )
        assert "coder-dflash7" in page.inner_text("#inflight")
        for t in threads:
            t.join(timeout=60)
        # ...then completed, with their TTFT and tokens per step.
        page.wait_for_function(
            "document.querySelectorAll('#recent tbody tr').length >= 3 && "
            "document.querySelectorAll('#inflight tbody tr').length === 0",
            timeout=10_000,
        )
        first = page.locator("#recent tbody tr").first.inner_text()
        assert " ms" in first and "ok" in first
        # Every mark explained, an agent column, and "off" where a panel would be empty.
        assert page.locator("#recent thead th").nth(2).inner_text() == "agent"
        legend = page.inner_text("#recent-legend")
        assert all(f"{mark} :" in legend for mark in ("–", "~", "*")), legend
        assert page.inner_text("#admission + p.empty").startswith("off: ")
        page.wait_for_function(
            "document.querySelector('#backends tbody .bars') !== null", timeout=15_000
        )
        page.screenshot(path=str(artifacts / "dashboard.png"), full_page=True)
        assert errors == []
        # Logging out ends the session on the server, not only in this browser.
        page.click("form.logout button")
        page.wait_for_selector("input[name=token]", timeout=10_000)
        assert page.context.cookies() == []
        ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
        stale = httpx.get(
            gw.admin + "/dashboard/snapshot",
            verify=ctx,
            timeout=10,
            cookies={cookie["name"]: cookie["value"]},
        )
        assert stale.status_code == 401
        browser.close()
        assert not any(ADMIN_TOKEN in url for url in urls), urls
