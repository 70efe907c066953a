"""The admin API's interactive docs in a real headless Chromium, offline: every asset comes
from the gateway, and no request leaves loopback."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from tests.admin.browser import CHROMIUM, launch


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is installed by `make test`")
def test_admin_docs_render_every_operation_offline(certs, artifacts: Path) -> None:
    from playwright.sync_api import Route, sync_playwright

    with (
        GatewayServer(coder_policy({"a": "http://127.0.0.1:9"}), certs=certs) as gw,
        sync_playwright() as pw,
    ):
        browser = launch(pw)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        requested: list[str] = []
        outside: list[str] = []

        def gate(route: Route) -> None:
            url = route.request.url
            requested.append(url)
            if urlsplit(url).hostname not in ("127.0.0.1", "localhost"):
                outside.append(url)
                route.abort()
            else:
                route.continue_()

        page.route("**/*", gate)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{gw.admin}/admin/docs")
        page.wait_for_selector(".opblock", timeout=15_000)
        text = page.inner_text("#swagger-ui")
        for path in (
            "/admin/policy",
            "/admin/policy/validate",
            "/admin/policy/explain",
            "/admin/policy/history",
            "/admin/policy/rollback",
            "/admin/status",
        ):
            assert path in text
        assert page.locator(".opblock-put").count() == 1
        assert page.locator(".opblock-post").count() == 3
        assert page.locator("button.authorize").count() == 1  # the bearer scheme
        page.screenshot(path=str(artifacts / "admin-docs.png"), full_page=True)
        browser.close()
    assert outside == [] and errors == []
    assert any(u.endswith("/admin/docs/static/swagger-ui-bundle.js") for u in requested)
    assert any(u.endswith("/admin/openapi.json") for u in requested)
