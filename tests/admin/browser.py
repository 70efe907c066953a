"""Headless Chromium for the admin pages' tests (Debian's, installed by `make test`)."""

from __future__ import annotations

import shutil
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Nothing leaves loopback: no QUIC, no background fetches, no component or sync traffic.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(pw: Any) -> Any:
    """A headless Chromium from a sync_playwright() handle."""
    return pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
