"""Admin and policy attacks (docs/security-hardening.md), replayed against the real gateway:
logins of one token, short tokens at start, the explain body, documents nested thousands deep
(through the API and the watched file), an operator secret sent where the operator did not
bind it, and a removed backend in /admin/status.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import yaml

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles
from proxy.safety import UnsafeSettings, check_startup
from proxy.settings import Settings

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
ALICE = "alice-token-" + "a" * 32
FORM = {"content-type": "application/x-www-form-urlencoded"}
COOKIE = "specrouter_dashboard"
SECRET_ENV = "SPECROUTER_TEST_BOUND_KEY"


@pytest.fixture(scope="module")
def gw(certs: CertFiles) -> Iterator[GatewayServer]:
    operator = {
        "secrets": {"coder-key": {"env": SECRET_ENV, "engines": ["127.0.0.2:9001"]}},
        "engine_hosts": ["127.0.0.1", "127.0.0.2"],
    }
    with (
        SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim,
        GatewayServer(
            coder_policy({"a": sim.url, "b": sim.url}),
            certs=certs,
            operator=operator,
            args=("--admin-token", f"alice={ALICE}"),
        ) as gateway,
    ):
        yield gateway


def _document(gw: GatewayServer) -> tuple[str, dict[str, Any]]:
    r = gw.admin_get("/admin/policy")
    return r.headers["etag"], r.json()["document"]


def _send(
    gw: GatewayServer, path: str, content: bytes | Iterator[bytes], method: str = "POST"
) -> httpx.Response:
    etag, _ = _document(gw)
    return httpx.request(
        method, gw.admin + path, headers={**AUTH, "if-match": etag}, content=content, timeout=30
    )


def test_many_logins_with_one_token_log_no_one_else_out(gw: GatewayServer) -> None:
    with httpx.Client(base_url=gw.admin, timeout=10) as alice:
        r = alice.post("/dashboard/login", content=f"token={ALICE}".encode(), headers=FORM)
        assert r.status_code == 303
        with httpx.Client(base_url=gw.admin, timeout=10) as attacker:
            first = None
            for _ in range(1001):  # the finding: 1,001 logins with one token (the cap is 1,000)
                r = attacker.post(
                    "/dashboard/login", content=f"token={ADMIN_TOKEN}".encode(), headers=FORM
                )
                assert r.status_code == 303
                first = first or r.cookies[COOKIE]
            assert attacker.get("/dashboard/snapshot").status_code == 200  # its newest
        assert alice.get("/dashboard/snapshot").status_code == 200, "alice was logged out"
    with httpx.Client(base_url=gw.admin, timeout=10, cookies={COOKIE: first or ""}) as old:
        assert old.get("/dashboard/snapshot").status_code == 401  # its own oldest went


@pytest.mark.parametrize("kind", ["dashboard", "scrape"])
@pytest.mark.parametrize("token", ["x", "short-but-not-32"])
def test_a_short_dashboard_or_scrape_token_is_refused_at_start(kind: str, token: str) -> None:
    settings = Settings(admin_token=[ADMIN_TOKEN], **{f"{kind}_token": token})
    with pytest.raises(UnsafeSettings, match=f"the {kind} token has {len(token)} characters"):
        check_startup(settings)
    check_startup(Settings(admin_token=[ADMIN_TOKEN], **{f"{kind}_token": "t" * 40}))


def _chunks(total: int) -> Iterator[bytes]:
    piece = b" " * 65536
    for _ in range(total // len(piece)):
        yield piece


def _deep_json(levels: int) -> bytes:
    return b'{"version": "x", "document": ' + b"[" * levels + b"]" * levels + b"}"


def _deep_yaml(levels: int) -> bytes:
    return b"schema: 1\nbackends: " + b"[" * levels + b"]" * levels + b"\n"


def _explain_deep(levels: int) -> bytes:
    return b'{"request": {"model": "coder", "x": ' + b"[" * levels + b"]" * levels + b"}}"


# (name, path, method, body, its status, a piece of its answer)
BODIES: list[tuple[str, str, str, Callable[[], Any], int, str]] = [
    (
        "explain-50MB-declared",
        "/admin/policy/explain",
        "POST",
        lambda: b"{" + b" " * (50 << 20) + b"}",
        413,
        "more than",
    ),
    (
        "explain-unsized",
        "/admin/policy/explain",
        "POST",
        lambda: _chunks(8 << 20),
        413,
        "more than",
    ),
    ("explain-deep", "/admin/policy/explain", "POST", lambda: _explain_deep(5000), 400, "explain"),
    ("put-json-5000-deep", "/admin/policy", "PUT", lambda: _deep_json(5000), 422, "nested"),
    (
        "validate-yaml-20000-deep",
        "/admin/policy/validate",
        "POST",
        lambda: _deep_yaml(20000),
        422,
        "nested",
    ),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("name", "path", "method", "body", "status", "piece"), BODIES, ids=[b[0] for b in BODIES]
)
def test_a_hostile_admin_body_is_refused_in_the_apis_shape(
    gw: GatewayServer,
    name: str,
    path: str,
    method: str,
    body: Callable[[], Any],
    status: int,
    piece: str,
) -> None:
    etag, _ = _document(gw)
    started = time.monotonic()
    r = _send(gw, path, body(), method)
    assert r.status_code == status, r.text[:300]
    assert piece in r.json()["error"]["message"], r.text[:300]
    assert time.monotonic() - started < 10
    assert _document(gw)[0] == etag


def test_a_deep_document_in_the_watched_file_does_not_stop_the_watch(gw: GatewayServer) -> None:
    etag, doc = _document(gw)
    gw.policy_path.write_bytes(_deep_yaml(20000))
    deadline = time.monotonic() + 10
    while not any("nested too deeply" in line for line in gw.output):
        assert time.monotonic() < deadline, "the edit was never read"
        time.sleep(0.2)
    assert _document(gw)[0] == etag
    doc["routes"]["coder"]["defaults"] = {"temperature": 0.3}
    gw.write_policy(doc)  # a valid edit after it: still applied
    deadline = time.monotonic() + 10
    while _document(gw)[0] == etag:
        assert time.monotonic() < deadline, "the watcher stopped: a valid edit was not applied"
        time.sleep(0.2)


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.2:9001", True),  # where the operator bound the secret
        ("http://127.0.0.2:9002", False),  # an allowed host, another port: the editor's own
        ("http://127.0.0.1:9003", True),  # loopback engines take any secret
    ],
)
def test_a_secret_goes_only_where_the_operator_bound_it(
    gw: GatewayServer, url: str, ok: bool
) -> None:
    _, doc = _document(gw)
    doc["backends"]["b"]["url"] = url
    doc["backends"]["b"]["api_key"] = "coder-key"
    r = _send(gw, "/admin/policy/validate", yaml.safe_dump(doc).encode())
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 422 and "secrets.coder-key.engines" in r.text, r.text


def test_a_removed_backend_leaves_admin_status(gw: GatewayServer) -> None:
    deadline = time.monotonic() + 10
    while "b" not in gw.admin_get("/admin/status").json()["backends"]:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    _, doc = _document(gw)
    del doc["backends"]["b"]
    doc["routes"]["coder"]["variants"] = ["a"]
    doc["routes"]["coder"].pop("fallback", None)
    r = _send(gw, "/admin/policy", yaml.safe_dump(doc).encode(), "PUT")
    assert r.status_code == 200, r.text
    deadline = time.monotonic() + 10
    while "b" in (state := gw.admin_get("/admin/status").json()["backends"]):
        assert time.monotonic() < deadline, f"removed backend still shown: {state}"
        time.sleep(0.1)
    assert "a" in state
