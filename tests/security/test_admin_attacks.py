"""Attacks on the admin identity, replayed: the token never in a URL or a cookie, the audit's
"who" not forgeable, failed authentication throttled per source, /readyz naming nothing.

Each attack is a request (from its own loopback source address, so throttling one does not
touch another) with the expected answer, and a check that nothing changed: the policy version
and its history, and that no dashboard session was opened.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

ALICE = "alice-token-" + "a" * 32  # a second, named, admin token
LIMIT = 10
COOKIE = "specrouter_dashboard"


@pytest.fixture(scope="module")
def gw(certs) -> Iterator[GatewayServer]:
    with (
        SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim,
        GatewayServer(
            coder_policy({"a": sim.url}),
            certs=certs,
            args=(
                "--admin-tls",
                "--admin-token",
                f"alice={ALICE}",
                "--auth-failures-per-minute",
                str(LIMIT),
            ),
        ) as gateway,
    ):
        yield gateway


def _client(gw: GatewayServer, source: str, base: str) -> httpx.Client:
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    return httpx.Client(
        base_url=base,
        timeout=10,
        follow_redirects=False,
        transport=httpx.HTTPTransport(verify=ctx, local_address=source),
    )


def _history(gw: GatewayServer) -> list[dict[str, Any]]:
    with _client(gw, "127.0.0.1", gw.admin) as c:
        r = c.get("/admin/policy/history", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    history: list[dict[str, Any]] = r.json()["history"]
    return history


@dataclass(frozen=True)
class Attack:
    name: str
    method: str
    path: str
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    cookies: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None


_FORM = {"content-type": "application/x-www-form-urlencoded"}
ATTACKS = [
    Attack("dashboard-token-in-url", "GET", f"/dashboard?token={ADMIN_TOKEN}", 400),
    Attack("snapshot-token-in-url", "GET", f"/dashboard/snapshot?token={ADMIN_TOKEN}", 401),
    Attack("api-token-in-url", "GET", f"/admin/policy?token={ADMIN_TOKEN}", 401),
    Attack("login-by-get", "GET", f"/dashboard/login?token={ADMIN_TOKEN}", 405),
    Attack("login-wrong-token", "POST", "/dashboard/login", 401, _FORM, body=b"token=guess"),
    Attack("raw-token-as-cookie", "GET", "/dashboard/snapshot", 401, cookies={COOKIE: ADMIN_TOKEN}),
    Attack("forged-session-cookie", "GET", "/dashboard", 401, cookies={COOKIE: "x" * 43}),
    Attack(
        "forged-who-without-token",
        "PUT",
        "/admin/policy",
        401,
        {"x-specrouter-admin": "admin", "if-match": "*"},
        body=b"{}",
    ),
]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_admin_attack_is_refused_and_changes_nothing(gw: GatewayServer, attack: Attack) -> None:
    before = _history(gw)
    with _client(gw, "127.0.0.2", gw.admin) as c:
        c.cookies.update(attack.cookies)
        r = c.request(attack.method, attack.path, headers=attack.headers, content=attack.body)
        assert r.status_code == attack.status, r.text
        assert "set-cookie" not in r.headers  # no session opened
        assert ADMIN_TOKEN not in r.text
        assert c.get("/dashboard/snapshot").status_code == 401
    assert _history(gw) == before


def test_login_cookie_is_a_session_id_with_strict_flags(gw: GatewayServer) -> None:
    with _client(gw, "127.0.0.3", gw.admin) as c:
        r = c.post("/dashboard/login", content=f"token={ADMIN_TOKEN}".encode(), headers=_FORM)
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        header = r.headers["set-cookie"]
        flags = {part.strip().split("=")[0].lower() for part in header.split(";")[1:]}
        assert {"httponly", "secure", "samesite", "max-age", "path"} <= flags, header
        assert "samesite=strict" in header.lower() and "max-age=43200" in header.lower()
        sid = r.cookies[COOKIE]
        assert ADMIN_TOKEN not in header and len(sid) >= 32
        assert c.get("/dashboard/snapshot").status_code == 200
        assert c.post("/dashboard/logout").status_code == 303
    with _client(gw, "127.0.0.3", gw.admin) as c:
        c.cookies.set(COOKIE, sid)
        assert c.get("/dashboard/snapshot").status_code == 401  # ended on the server


def test_forged_admin_header_does_not_change_the_audit_who(gw: GatewayServer) -> None:
    with _client(gw, "127.0.0.4", gw.admin) as c:
        current = c.get("/admin/policy", headers={"authorization": f"Bearer {ALICE}"})
        document = current.json()["document"]
        document["routes"]["coder"]["defaults"] = {"temperature": 0.5}
        r = c.put(
            "/admin/policy",
            content=orjson.dumps(document),
            headers={
                "authorization": f"Bearer {ALICE}",
                "if-match": current.headers["etag"],
                "x-specrouter-admin": "admin",
                "x-specrouter-note": "lower temperature",
            },
        )
    assert r.status_code == 200, r.text
    last = _history(gw)[-1]
    assert (last["who"], last["note"], last["version"]) == (
        "alice",
        "lower temperature",
        r.json()["version"],
    )


# (listener, path, a wrong credential, a good one)
LISTENERS = [
    ("admin", "/admin/status", f"Bearer {'w' * 40}", f"Bearer {ADMIN_TOKEN}"),
    ("public", "/v1/models", "Bearer sk-wrong", f"Bearer {CLIENT_KEY}"),
]


@pytest.mark.parametrize(
    ("listener", "path", "wrong", "good"), LISTENERS, ids=[x[0] for x in LISTENERS]
)
def test_failed_authentication_is_throttled_per_source(
    gw: GatewayServer, listener: str, path: str, wrong: str, good: str
) -> None:
    base = gw.admin if listener == "admin" else gw.base
    attacker, other = (
        ("127.0.0.5", "127.0.0.6") if listener == "admin" else ("127.0.0.7", "127.0.0.8")
    )
    before = _history(gw)
    with _client(gw, attacker, base) as c:
        for _ in range(LIMIT):
            assert c.get(path, headers={"authorization": wrong}).status_code == 401
        for credential in (wrong, good):  # the right key too: a guess must not be confirmed
            r = c.get(path, headers={"authorization": credential})
            assert r.status_code == 429, r.text
            assert 1 <= int(r.headers["retry-after"]) <= 60
            assert r.json()["error"]["type"] == "RateLimitError"
    with _client(gw, other, base) as c:
        assert c.get(path, headers={"authorization": good}).status_code == 200
    assert _history(gw) == before
    logged = [
        line
        for line in gw.output
        if f"failed authentication on the {listener} listener from {attacker}" in line
    ]
    assert len(logged) == 1, logged  # at most once a minute per source


def test_readyz_says_ready_and_names_no_route(gw: GatewayServer) -> None:
    with _client(gw, "127.0.0.9", gw.base) as c:
        r = c.get("/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True}
    assert "coder" not in r.text
    with _client(gw, "127.0.0.9", gw.admin) as c:
        assert c.get("/admin/readyz").status_code == 401
        detail = c.get("/admin/readyz", headers={"authorization": f"Bearer {ADMIN_TOKEN}"})
    assert detail.json() == {"ready": True, "draining": False, "routes": {"coder": True}}


@pytest.mark.parametrize(
    ("listener", "path", "wrong", "good", "net"),
    [(*x, net) for x, net in zip(LISTENERS, ("127.0.6", "127.0.7"), strict=True)],
    ids=[x[0] for x in LISTENERS],
)
def test_wrong_keys_spread_over_a_network_throttle_it_but_never_a_right_key(
    gw: GatewayServer, listener: str, path: str, wrong: str, good: str, net: str
) -> None:
    """Wrong keys spread over a network's addresses, under the per-address limit each, are
    throttled by the network's count (8x the limit), which once refused every address of the
    network, a client with the right key included: it now refuses only addresses that failed
    themselves, each after one guess."""
    base = gw.admin if listener == "admin" else gw.base
    spread = LIMIT * 8 // 2  # addresses, two wrong keys each: the network's count
    for i in range(1, spread + 1):
        with _client(gw, f"{net}.{i}", base) as c:
            for _ in range(2):
                assert c.get(path, headers={"authorization": wrong}).status_code == 401
    with _client(gw, f"{net}.1", base) as c:  # an address that failed: its guess unconfirmed
        r = c.get(path, headers={"authorization": good})
        assert r.status_code == 429 and r.json()["error"]["type"] == "RateLimitError", r.text
        assert 1 <= int(r.headers["retry-after"]) <= 60
    with _client(gw, f"{net}.200", base) as c:  # a fresh address: one guess, then it waits
        assert c.get(path, headers={"authorization": wrong}).status_code == 401
        assert c.get(path, headers={"authorization": good}).status_code == 429
    with _client(gw, f"{net}.201", base) as c:  # a client of that network with the right key
        for _ in range(3):
            assert c.get(path, headers={"authorization": good}).status_code == 200
