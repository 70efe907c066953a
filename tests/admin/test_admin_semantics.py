"""Policy admin semantics: GET's body round-trips through PUT, preconditions come before the
body, rollback is conditional and idempotent, `If-Match: *`; and the answers FastAPI would
shape differently (404, 405, validation) keep the gateway's."""

from __future__ import annotations

import asyncio
import time
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
def admin(tmp_path: Path):
    config = tmp_path / "policy.yaml"
    config.write_text(
        yaml.safe_dump(coder_policy({"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:10"}))
    )
    settings = Settings(config=config, state_dir=tmp_path / "state", admin_token=TOKEN)
    gw = Gateway(settings, compile_policy(load_policy(config)))
    store = PolicyStore(gw.policy, config, settings.state_dir)
    app = create_admin_app(gw, policy_routes(gw, store))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")
    return gw, store, client


async def _get(client: httpx.AsyncClient) -> httpx.Response:
    r = await client.get("/admin/policy", headers=AUTH)
    assert r.status_code == 200
    return r


async def test_get_body_round_trips_through_put(admin) -> None:
    gw, store, client = admin
    got = await _get(client)
    r = await client.put(
        "/admin/policy", content=got.content, headers={**AUTH, "if-match": got.headers["etag"]}
    )
    assert r.status_code == 200, r.text
    assert r.json()["version"] == got.json()["version"] == gw.policy.current.version
    assert r.json()["changes"] == [] and r.headers["etag"] == got.headers["etag"]
    assert (await _get(client)).json() == got.json()
    # The wrapper edited: its document is what gets applied.
    edited = got.json()
    edited["document"]["routes"]["coder"]["defaults"] = {"temperature": 0.4}
    r = await client.put(
        "/admin/policy", json=edited, headers={**AUTH, "if-match": got.headers["etag"]}
    )
    assert r.status_code == 200, r.text
    assert gw.policy.current.document.routes["coder"].defaults == {"temperature": 0.4}
    assert yaml.safe_load(store.config.read_text())["routes"]["coder"]["defaults"] == {
        "temperature": 0.4
    }
    # validate takes the same bodies.
    r = await client.post("/admin/policy/validate", content=got.content, headers=AUTH)
    assert r.json() == {"valid": True, "version": got.json()["version"]}


async def test_a_stale_if_match_answers_412_before_the_body_is_judged(admin) -> None:
    gw, store, client = admin
    stale = {**AUTH, "if-match": '"0000000000000000"'}
    for body in (b"routes: [broken", b'{"version": "x", "document": {"schema": 2}}'):
        r = await client.put("/admin/policy", content=body, headers=stale)
        assert r.status_code == 412, r.text
        assert r.json()["error"]["current_version"] == gw.policy.current.version
    r = await client.post("/admin/policy/rollback", content=b"not json", headers=stale)
    assert r.status_code == 412
    # With a current ETag the same invalid body is judged: 422, nothing applied.
    etag = (await _get(client)).headers["etag"]
    r = await client.put(
        "/admin/policy", content=b"routes: [broken", headers={**AUTH, "if-match": etag}
    )
    assert r.status_code == 422 and "YAML" in r.json()["error"]["message"]
    assert len(store.history()) == 1


async def test_rollback_needs_if_match_and_is_a_no_op_onto_the_running_version(admin) -> None:
    gw, store, client = admin
    first = await _get(client)
    r = await client.post("/admin/policy/rollback", json={"version": 1}, headers=AUTH)
    assert r.status_code == 428
    # #1 is running: 200 with it, no new history entry, nothing written.
    r = await client.post(
        "/admin/policy/rollback",
        json={"version": 1},
        headers={**AUTH, "if-match": first.headers["etag"]},
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"version": first.json()["version"], "number": 1, "changes": []}
    assert [h["number"] for h in store.history()] == [1]
    # A real change, then rolling back to #1 applies it again as #3.
    doc = first.json()["document"]
    doc["routes"]["coder"]["defaults"] = {"temperature": 0.3}
    r = await client.put(
        "/admin/policy",
        content=yaml.safe_dump(doc),
        headers={**AUTH, "if-match": first.headers["etag"]},
    )
    assert r.status_code == 200
    r = await client.post(
        "/admin/policy/rollback",
        json={"version": 1},
        headers={**AUTH, "if-match": r.headers["etag"]},
    )
    assert r.status_code == 200 and r.json()["number"] == 3 and r.json()["changes"]
    assert gw.policy.current.version == first.json()["version"]
    assert r.headers["etag"] == first.headers["etag"]
    assert store.history()[-1]["note"] == "rollback to #1"


async def test_if_match_star_means_any_current_version(admin) -> None:
    gw, _, client = admin
    doc = (await _get(client)).json()["document"]
    doc["routes"]["coder"]["defaults"] = {"temperature": 0.7}
    r = await client.put("/admin/policy", json=doc, headers={**AUTH, "if-match": "*"})
    assert r.status_code == 200, r.text
    assert gw.policy.current.version == r.json()["version"]


async def test_the_token_comes_first_and_unknown_routes_keep_their_answers(admin) -> None:
    _, _, client = admin
    r = await client.put("/admin/policy", content=b"[", headers={"if-match": '"stale"'})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json()["error"]["type"] == "AuthenticationError"
    r = await client.get("/admin/nothing", headers=AUTH)
    assert (r.status_code, r.text) == (404, "Not Found")
    r = await client.delete("/admin/policy/history", headers=AUTH)
    assert r.status_code == 405 and r.headers["allow"] == "GET"
    r = await client.post("/admin/policy/explain", json={"request": 5}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("cannot explain")


async def test_the_admin_openapi_describes_every_operation(admin) -> None:
    _, _, client = admin
    r = await client.get("/admin/openapi.json")  # a description, no state: open
    assert r.status_code == 200
    spec = r.json()
    ops = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert {
        ("GET", "/admin/policy"),
        ("PUT", "/admin/policy"),
        ("POST", "/admin/policy/validate"),
        ("POST", "/admin/policy/explain"),
        ("GET", "/admin/policy/history"),
        ("POST", "/admin/policy/rollback"),
        ("GET", "/admin/status"),
    } <= ops
    put = spec["paths"]["/admin/policy"]["put"]
    assert {"401", "412", "422", "428"} <= put["responses"].keys()
    assert put["security"] == [{"HTTPBearer": []}]
    assert "HTTPValidationError" not in r.text
    page = await client.get("/admin/docs")
    assert page.status_code == 200 and "/admin/openapi.json" in page.text
    assert "https://" not in page.text  # every asset is served here
    assert (await client.get("/admin/docs/static/swagger-ui-bundle.js")).status_code == 200


async def test_a_file_poll_while_a_put_is_applied_records_it_once(admin, monkeypatch) -> None:
    gw, store, client = admin
    got = await _get(client)
    doc = got.json()["document"]
    doc["routes"]["coder"]["defaults"] = {"temperature": 0.2}
    record = store._record

    def slow_record(*args, **kwargs):
        time.sleep(0.3)  # the file is written, the swap not done yet
        return record(*args, **kwargs)

    monkeypatch.setattr(store, "_record", slow_record)

    async def poll_meanwhile() -> bool:
        await asyncio.sleep(0.1)
        return await store.poll(force=True)

    put, polled = await asyncio.gather(
        client.put("/admin/policy", json=doc, headers={**AUTH, "if-match": got.headers["etag"]}),
        poll_meanwhile(),
    )
    assert put.status_code == 200 and polled is False
    assert [h["who"] for h in store.history()] == ["startup", "admin"]
    assert gw.policy.current.version == put.json()["version"]
