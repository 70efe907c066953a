"""The admin policy API and the store behind it (in-process: nothing here streams)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest
import yaml

from loadtests.harness.gateway import coder_policy
from policies.compiled import compile_policy
from policies.schema import load_policy
from proxy.admin.app import create_admin_app
from proxy.admin.policy_api import policy_routes
from proxy.admin.policy_store import PolicyStore
from proxy.gateway import Gateway
from proxy.settings import Settings

TOKEN = "t0ken"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def setup(tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(
        yaml.safe_dump(coder_policy({"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:10"}))
    )
    settings = Settings(config=config, state_dir=tmp_path / "state", admin_token=TOKEN)
    gw = Gateway(settings, compile_policy(load_policy(config)))
    store = PolicyStore(gw.policy, config, settings.state_dir)
    app = create_admin_app(gw, policy_routes(gw, store))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")
    return gw, store, client, config


def _edited(config: Path, **route_changes) -> bytes:
    doc = yaml.safe_load(config.read_text())
    doc["routes"]["coder"].update(route_changes)
    return yaml.safe_dump(doc).encode()


async def test_admin_needs_the_token(setup) -> None:
    _, _, client, _ = setup
    assert (await client.get("/admin/policy")).status_code == 401
    assert (
        await client.get("/admin/policy", headers={"authorization": "Bearer no"})
    ).status_code == 401
    assert (await client.get("/metrics")).status_code == 200


async def test_get_put_with_etag(setup) -> None:
    gw, store, client, config = setup
    r = await client.get("/admin/policy", headers=AUTH)
    etag = r.headers["etag"]
    assert r.json()["version"] == gw.policy.current.version
    new = _edited(config, defaults={"temperature": 0.6})
    assert (await client.put("/admin/policy", content=new, headers=AUTH)).status_code == 428
    r = await client.put("/admin/policy", content=new, headers={**AUTH, "if-match": etag})
    assert r.status_code == 200, r.text
    assert any("routes.coder.defaults.temperature" in c for c in r.json()["changes"])
    assert gw.policy.current.version == r.json()["version"] != etag.strip('"')
    assert yaml.safe_load(config.read_text())["routes"]["coder"]["defaults"] == {"temperature": 0.6}
    # The old ETag is stale now.
    r = await client.put("/admin/policy", content=new, headers={**AUTH, "if-match": etag})
    assert r.status_code == 412


async def test_concurrent_puts_with_the_same_etag(setup) -> None:
    _, _, client, config = setup
    etag = (await client.get("/admin/policy", headers=AUTH)).headers["etag"]
    bodies = [_edited(config, defaults={"temperature": t}) for t in (0.5, 0.6)]
    results = await asyncio.gather(
        *(
            client.put("/admin/policy", content=b, headers={**AUTH, "if-match": etag})
            for b in bodies
        )
    )
    assert sorted(r.status_code for r in results) == [200, 412]


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"variants": ["a", "nope"]}, "nope"),
        ({"defaults": {"temperature": "hot"}}, "temperature"),
        ({"rules": [{"name": "x", "kind": "load", "use": "zz", "max_in_flight": 2}]}, "zz"),
    ],
)
async def test_invalid_put_changes_nothing(setup, change, needle) -> None:
    gw, store, client, config = setup
    before_file, before_version = config.read_bytes(), gw.policy.current.version
    etag = (await client.get("/admin/policy", headers=AUTH)).headers["etag"]
    r = await client.put(
        "/admin/policy", content=_edited(config, **change), headers={**AUTH, "if-match": etag}
    )
    assert r.status_code == 422
    assert needle in r.json()["error"]["message"]
    assert config.read_bytes() == before_file
    assert gw.policy.current.version == before_version
    assert len(store.history()) == 1


async def test_validate_explain_history_rollback(setup) -> None:
    gw, store, client, config = setup
    r = await client.post("/admin/policy/validate", content=b"schema: 1\n", headers=AUTH)
    assert r.status_code == 422
    r = await client.post(
        "/admin/policy/explain",
        headers=AUTH,
        json={
            "request": {"model": "coder", "messages": [{"role": "user", "content": "hi"}]},
            "client": "agent",
            "state": {"backends": {"a": {"health": "down"}}},
        },
    )
    decision = r.json()["decision"]
    assert decision["backend"] == "b" and decision["verdicts"]
    first = gw.policy.current.version
    etag = (await client.get("/admin/policy", headers=AUTH)).headers["etag"]
    await client.put(
        "/admin/policy", content=_edited(config, defaults={}), headers={**AUTH, "if-match": etag}
    )
    history = (await client.get("/admin/policy/history", headers=AUTH)).json()["history"]
    assert [h["number"] for h in history] == [1, 2]
    # Rollback is a conditional change like PUT (test_admin_semantics: 428 without If-Match).
    anyv = {**AUTH, "if-match": "*"}
    r = await client.post("/admin/policy/rollback", json={"version": 1}, headers=anyv)
    assert r.status_code == 200 and gw.policy.current.version == first
    assert (
        await client.post("/admin/policy/rollback", json={"version": 99}, headers=anyv)
    ).status_code == 404


async def test_file_edits_are_applied_or_refused(setup) -> None:
    gw, store, _, config = setup
    before = gw.policy.current.version
    config.write_text("routes: [broken")
    os.utime(config, ns=(1, 1))
    assert await store.poll() is False
    assert gw.policy.current.version == before and store.reload_failures == 1
    config.write_bytes(_good_edit(store))
    assert await store.poll() is True
    assert gw.policy.current.version != before


def _good_edit(store: PolicyStore) -> bytes:
    doc = store.current.document.to_data()
    doc["routes"]["coder"]["defaults"] = {"temperature": 0.5}
    return yaml.safe_dump(doc).encode()


async def test_a_crash_mid_write_leaves_the_last_good_file(setup, monkeypatch) -> None:
    gw, store, client, config = setup
    before = config.read_bytes()

    def crash(*_a, **_k):
        raise OSError("power cut")

    monkeypatch.setattr(os, "replace", crash)
    etag = (await client.get("/admin/policy", headers=AUTH)).headers["etag"]
    with pytest.raises(OSError):
        await store.apply(_good_edit(store), who="t", if_match=etag.strip('"'))
    assert config.read_bytes() == before
    assert gw.policy.current.version == etag.strip('"')
    assert not [p for p in config.parent.iterdir() if p.name.endswith(".tmp")]
