"""x-codex-turn-state tokens (proxy/relay/turnstate.py): issued, echoed, verified; a token
another client, another session, a forger or time changed is ignored; and decide() keeps a
turn on the engine a valid token names, whatever the session table says."""

from __future__ import annotations

import secrets

import pytest

from policies.engine import decide
from policies.types import RequestView
from proxy.relay.turnstate import MAX_AGE_S, MAX_TOKEN_BYTES, TurnState
from proxy.safety import UnsafeSettings, check_startup
from proxy.settings import Settings
from tests.policies.test_stickiness import policy, session, state

NOW = 1_800_000_000.0
SECRET = b"s" * 32


def test_round_trip_names_the_engine() -> None:
    ts = TurnState(SECRET)
    token = ts.issue("agent", "s-1", "coder-mtp3", NOW)
    assert token is not None and len(token) <= MAX_TOKEN_BYTES
    assert ts.verify(token, "agent", "s-1", NOW + 5) == "coder-mtp3"
    # another replica with the same secret (configured, or shared through Redis) agrees
    assert TurnState(SECRET).verify(token, "agent", "s-1", NOW + 5) == "coder-mtp3"


def _forged(token: bytes) -> list[tuple[str, bytes]]:
    v, name, issued, mac = token.split(b".")
    other = TurnState(SECRET).issue("agent", "s-1", "b", NOW)
    assert other is not None
    return [
        ("engine-swapped", b".".join((v, other.split(b".")[1], issued, mac))),
        ("time-swapped", b".".join((v, name, b"%d" % (NOW + 100), mac))),
        ("mac-flipped", token[:-1] + (b"0" if token[-1:] != b"0" else b"1")),
        ("version", b".".join((b"v2", name, issued, mac))),
        ("too-long", token + b"x" * MAX_TOKEN_BYTES),
        ("garbage", b"not a token"),
        ("bad-base64", b".".join((v, b"!!!", issued, mac))),
        ("empty", b""),
    ]


@pytest.mark.parametrize("case", range(8))
def test_forged_tokens_are_ignored(case: int) -> None:
    ts = TurnState(SECRET)
    token = ts.issue("agent", "s-1", "a", NOW)
    assert token is not None
    name, forged = _forged(token)[case]
    assert ts.verify(forged, "agent", "s-1", NOW) is None, name


@pytest.mark.parametrize(
    ("what", "client", "session_key", "now", "secret"),
    [
        ("another client", "other", "s-1", NOW, SECRET),
        ("another session", "agent", "s-2", NOW, SECRET),
        ("expired", "agent", "s-1", NOW + MAX_AGE_S + 1, SECRET),
        ("from the future", "agent", "s-1", NOW - 10, SECRET),
        ("another secret", "agent", "s-1", NOW, b"t" * 32),
    ],
)
def test_a_token_verifies_only_for_its_client_session_time_and_secret(
    what: str, client: str, session_key: str, now: float, secret: bytes
) -> None:
    token = TurnState(SECRET).issue("agent", "s-1", "a", NOW)
    assert TurnState(secret).verify(token, client, session_key, now) is None, what


def test_no_secret_yet_nothing_issued_nothing_honoured() -> None:
    pending = TurnState.from_settings(None, shared=True)  # Redis's secret not read yet
    assert pending.issue("agent", "s-1", "a", NOW) is None
    assert (
        pending.verify(TurnState(SECRET).issue("agent", "s-1", "a", NOW), "agent", "s-1", NOW)
        is None
    )
    own = TurnState.from_settings(None, shared=False)  # one process: a random secret
    assert own.verify(own.issue("agent", "s-1", "a", NOW), "agent", "s-1", NOW) == "a"
    configured = TurnState.from_settings("x" * 16, shared=True)
    assert configured.secret == b"x" * 16


@pytest.mark.parametrize(
    ("turn_engine", "held", "live", "backend", "reason"),
    [
        # the table says b and a move to a pays: the turn's token says b, the turn stays
        ("b", "b", state(), "b", "turn-state"),
        # the table lost the row (another replica, a restart): the token still holds the turn
        ("b", None, state(), "b", "turn-state"),
        # the rules agree with the token: their reason stands
        ("a", "b", state(), "a", "default"),
        # the token's engine cannot serve: placed as without it
        ("b", "b", state(b="down"), "a", "health"),
        # an engine the route does not have: ignored, stickiness decides
        ("gone", "b", state(), "a", "session-move"),
    ],
)
def test_decide_keeps_the_turn_on_the_token_engine(
    turn_engine: str, held: str | None, live, backend: str, reason: str
) -> None:
    view = RequestView(
        endpoint="responses",
        model="coder",
        client="agent",
        session=session(held, prefix_tokens=20_000, out_tokens_per_turn=500),
        turn_engine=turn_engine,
    )
    d = decide(view, live, policy([]))
    assert (d.backend, d.reason) == (backend, reason)


ADMIN = "admin-token-of-at-least-thirty-two-characters"


@pytest.mark.parametrize(
    ("secret", "refused"),
    [
        ("k" * 16, "16 characters"),  # one token allows an offline guess of it
        ("0123456789abcdef", "16 characters"),
        ("k" * 32, "1 distinct characters"),
        ("abcd" * 8, "4 distinct characters"),
        pytest.param(secrets.token_hex(16), None, id="random-32-hex"),
    ],
)
def test_a_weak_configured_secret_is_refused_at_start(secret: str, refused: str | None) -> None:
    settings = Settings(admin_token=[ADMIN], turn_state_secret=secret)
    if refused is None:
        check_startup(settings)
    else:
        with pytest.raises(UnsafeSettings, match=f"turn-state .* has {refused}"):
            check_startup(settings)
