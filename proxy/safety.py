"""Startup refusals: settings that would leave the admin API open to whoever finds it.

The admin API changes what the gateway routes where, so its token must be one nobody else knows
(long, and not one printed in a shipped file) and, off loopback, it travels only over TLS.
"""

from __future__ import annotations

from pathlib import Path

from proxy.settings import Settings, is_loopback, split_hostport

MIN_TOKEN_CHARS = 32
# The turn-state secret signs tokens whose every other MAC input the client knows, so one token
# allows an offline guess: a secret of few distinct characters ("k" * 32) is refused too (a
# random 32-character hex string has fewer than 8 with odds of 4e-8).
MIN_SECRET_DISTINCT = 8
# Defaults published in documentation and examples, here or anywhere.
PUBLISHED_TOKENS = frozenset({"change-me", "changeme", "admin", "secret", "password", "token"})
REPO_ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("deploy", "docs", "README.md", "policies")  # what an installation ships with


class UnsafeSettings(ValueError):
    """Settings the gateway refuses to start with."""


def check_startup(settings: Settings, shipped_root: Path = REPO_ROOT) -> None:
    # Every token the admin listener takes: the dashboard's and the scrape token read less than
    # an admin token does, but a one-character one is guessed (the dashboard names every
    # client, route and engine).
    tokens = [("admin", t) for t in settings.admin_tokens().values()]
    tokens += [(kind, t) for kind, t in _other_tokens(settings) if t]  # "": not set
    for kind, token in tokens:
        if len(token) < MIN_TOKEN_CHARS:
            raise UnsafeSettings(
                f"the {kind} token has {len(token)} characters; use "
                f"{MIN_TOKEN_CHARS} or more (e.g. `openssl rand -hex 32`)"
            )
        if kind == _TURN_STATE and len(set(token)) < MIN_SECRET_DISTINCT:
            raise UnsafeSettings(
                f"the {kind} token has {len(set(token))} distinct characters; use a random one "
                "(e.g. `openssl rand -hex 32`)"
            )
        if token.lower() in PUBLISHED_TOKENS or _in_shipped_files(token, shipped_root):
            raise UnsafeSettings(f"the {kind} token is a published default: generate your own")
    host, _ = split_hostport(settings.admin_listen)
    if not is_loopback(host) and not (settings.admin_tls or settings.admin_client_ca):
        raise UnsafeSettings(
            f"the admin listener {settings.admin_listen} is off loopback "
            "without TLS: pass --admin-tls (or --admin-client-ca)"
        )
    if settings.metrics_listen is not None:
        host, _ = split_hostport(settings.metrics_listen)
        if not is_loopback(host):
            raise UnsafeSettings(
                f"--metrics-listen {settings.metrics_listen} is plain HTTP: loopback only"
            )


_TURN_STATE = "turn-state (SPECROUTER_TURN_STATE_SECRET)"


def _other_tokens(settings: Settings) -> list[tuple[str, str | None]]:
    return [
        ("dashboard", settings.dashboard_token),
        ("scrape", settings.scrape_token),
        (_TURN_STATE, settings.turn_state_secret),
    ]


def _in_shipped_files(token: str, root: Path) -> bool:
    """Whether the token appears in a file shipped with the gateway (an example copied as is)."""
    needle = token.encode()
    for name in SHIPPED:
        top = root / name
        paths = [top] if top.is_file() else sorted(top.rglob("*")) if top.is_dir() else []
        for path in paths:
            try:
                if (
                    path.is_file()
                    and path.stat().st_size < 4_000_000
                    and needle in path.read_bytes()
                ):
                    return True
            except OSError:
                continue
    return False
