"""Named admin tokens, the failure throttle and dashboard sessions, without a server."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from pydantic import ValidationError

from proxy.admin.sessions import Sessions
from proxy.auth import KNOWN_CREDENTIALS, Clients, hash_key, named_token, token_name
from proxy.settings import Settings
from proxy.throttle import AuthThrottle

T = "t" * 40


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (T, ("admin", T)),
        (f"alice={T}", ("alice", T)),
        (
            "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo==",
            ("admin", "YWJjZGVmZ2hpamtsbW5vcHFyc3R1dnd4eXo=="),
        ),
        (f"=x{T}", ("admin", f"=x{T}")),
        (f"a b={T}", ("admin", f"a b={T}")),
    ],
)
def test_a_token_setting_names_its_token(value: str, expected: tuple[str, str]) -> None:
    assert named_token(value, "admin") == expected


def test_settings_take_one_token_or_several_with_unique_names() -> None:
    assert Settings(admin_token=T).admin_tokens() == {"admin": T}
    assert Settings(admin_token=[T, f"ci={T}x"]).admin_tokens() == {"admin": T, "ci": T + "x"}
    with pytest.raises(ValidationError, match="share a name"):
        Settings(admin_token=[T, f"admin={T}x"])


def test_token_name_finds_the_matching_name_only() -> None:
    digests = {"admin": hash_key("one"), "ci": hash_key("two")}
    assert [token_name(t, digests) for t in ("one", "two", "three", None)] == [
        "admin",
        "ci",
        None,
        None,
    ]


def test_throttle_counts_a_minute_of_failures_and_forgets_the_oldest_source() -> None:
    now = [0.0]
    throttle = AuthThrottle(3, listener="test", max_sources=2, clock=lambda: now[0])
    for _ in range(3):
        assert throttle.retry_after("a") is None
        throttle.failed("a")
    assert throttle.retry_after("a") == 60
    now[0] = 59.5
    assert throttle.retry_after("a") == 1
    now[0] = 60.0
    assert throttle.retry_after("a") is None  # the first failure left the window
    throttle.failed("a")
    throttle.failed("a")
    throttle.failed("b")
    throttle.failed("c")  # beyond two sources: "a", the least recent, is forgotten
    assert throttle.retry_after("a") is None and set(throttle._sources) == {"b", "c"}
    assert AuthThrottle(0, listener="off").retry_after("a") is None


def test_sessions_expire_and_close() -> None:
    now = [0.0]
    sessions = Sessions(10.0, max_sessions=2, clock=lambda: now[0])
    first, second = sessions.open("admin"), sessions.open("ci")
    assert first != second and sessions.name(first) == "admin"
    sessions.close(second)
    assert sessions.name(second) is None
    now[0] = 10.0
    assert sessions.name(first) is None and sessions.name(None) is None
    kept = [sessions.open("x"), sessions.open("y"), sessions.open("z")]
    assert [sessions.name(s) for s in kept] == [None, "y", "z"]  # bounded: oldest out


def test_a_client_credential_is_hashed_once_per_policy() -> None:
    """The public listener's client lookup (`Clients`): a credential that names a client is
    parsed and hashed once for the policy it was found in; another policy (a reload that may
    have dropped the key) looks again; a wrong key is looked up every time and never kept."""
    looked: list[str] = []
    good = b"Bearer " + T.encode()

    def policy(keys: dict[str, str]) -> tuple[object, Callable[[str], str | None]]:
        def lookup(digest: str) -> str | None:
            looked.append(digest)
            return keys.get(digest)

        return object(), lookup

    clients: Clients[str] = Clients()
    first, lookup = policy({hash_key(T): "alice"})
    assert clients.find(first, lookup, good, None) == "alice"
    assert clients.find(first, lookup, good, None) == "alice"
    assert looked == [hash_key(T)]  # the second request read what the first found
    assert clients.find(first, lookup, None, T.encode()) == "alice"  # x-api-key: its own entry
    assert clients.find(first, lookup, b"Bearer wrong", None) is None
    assert clients.find(first, lookup, b"Bearer wrong", None) is None
    assert looked[-2:] == [hash_key("wrong")] * 2
    reloaded, without = policy({})
    assert clients.find(reloaded, without, good, None) is None  # the reload dropped the key
    # both headers with two different keys name no client, whatever was found before
    assert clients.find(first, lookup, good, b"other") is None


def test_the_kept_credentials_are_bounded() -> None:
    clients: Clients[str] = Clients()
    owner = object()
    for i in range(KNOWN_CREDENTIALS + 10):  # spellings of one valid key: each kept, up to the cap
        assert clients.find(owner, lambda _: "alice", b"Bearer  " + b" " * i + b"k", None)
    assert 0 < len(clients._known) <= KNOWN_CREDENTIALS
