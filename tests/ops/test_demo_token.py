"""The demo's admin token: made once, kept, never read as an option where it is pasted."""

from __future__ import annotations

from pathlib import Path

from proxy.ops.demo import demo_admin_token


def test_a_new_token_never_begins_with_a_dash(tmp_path: Path) -> None:
    for i in range(300):  # token_urlsafe begins with "-" one time in 64
        state = tmp_path / str(i)
        state.mkdir()
        token = demo_admin_token(state)
        assert not token.startswith("-") and len(token) >= 32, token
        assert (state / "admin.token").stat().st_mode & 0o777 == 0o600
        assert demo_admin_token(state) == token  # kept: the next demo reuses it
