"""The named adaptations (proxy/relay/adapt.py) as pure functions: what each rule leaves out,
and that it is off where the engine accepts the original. Against real vLLM, with the counter:
tests/engines/vllm/test_vllm_agent_replay.py."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from policies.types import Endpoint
from proxy import vllm_wire
from proxy.relay.adapt import RULES, adapt, candidates

BLOB = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA..."}
READABLE = {"type": "reasoning", "id": "rs_2", "summary": [], "content": None}
SUMMARISED = {
    "type": "reasoning",
    "id": "rs_3",
    "summary": [{"type": "summary_text", "text": "looked at files"}],
    "encrypted_content": "gAAAB...",
}
CALL = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}


def _body(*items: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "input": [{"role": "user", "content": "hi"}, *items], "stream": True}


def test_encrypted_reasoning_is_left_out_for_vllm() -> None:
    body = _body(BLOB, CALL, SUMMARISED, READABLE)
    out, applied = adapt(body, "responses", "vllm", "0.32.0")
    assert applied == ("responses-encrypted-reasoning",)
    kinds = [(i.get("type"), i.get("id")) for i in out["input"]]
    # the blob alone is left out; a summarised item keeps its text, not its blob
    assert kinds == [
        (None, None),
        ("function_call", None),
        ("reasoning", "rs_3"),
        ("reasoning", "rs_2"),
    ]
    assert "encrypted_content" not in out["input"][2]
    assert out["input"][2]["summary"] == SUMMARISED["summary"]
    assert body["input"][1] is BLOB  # the client's body is not changed in place


def test_nothing_changes_without_encrypted_content() -> None:
    body = _body(READABLE, CALL)
    out, applied = adapt(body, "responses", "vllm", "0.28.0")
    assert out is body and applied == ()


def test_off_for_engines_that_accept_the_original() -> None:
    body = _body(BLOB, CALL)
    for kind in ("openai", "llamacpp"):
        out, applied = adapt(body, "responses", kind, "0.32.0")
        assert out is body and applied == ()
    out, applied = adapt(body, "chat", "vllm", "0.32.0")  # another endpoint: not this rule's
    assert out is body and applied == ()


def test_every_release_the_gateway_knows_refuses_encrypted_reasoning() -> None:
    for version in ("0.28.0", "0.32.0", "0.33.0", "0.32.0+cpu"):
        assert vllm_wire.refuses_encrypted_reasoning(version)
    assert vllm_wire.release("0.32.0+cpu") == (0, 32, 0)
    assert vllm_wire.release("nonsense") == (99, 0, 0)


def test_rule_names_are_unique_and_documented() -> None:
    from pathlib import Path

    names = [r.name for r in RULES]
    assert len(set(names)) == len(names)
    doc = (Path(__file__).resolve().parents[2] / "docs" / "vllm-adaptations.md").read_text()
    assert all(f"`{n}`" in doc for n in names)


def test_a_released_body_is_read_from_its_bytes() -> None:
    """Once decided, the body's containers are views of their bytes (exchange.release_tree)."""
    body = _body(BLOB, CALL)
    released = {**body, "input": memoryview(orjson.dumps(body["input"]))}
    out, applied = adapt(released, "responses", "vllm", "0.32.0")
    assert applied == ("responses-encrypted-reasoning",)
    assert [i.get("type") for i in out["input"]] == [None, "function_call"]
    plain = {**body, "input": memoryview(orjson.dumps([READABLE, CALL]))}
    assert adapt(plain, "responses", "vllm", "0.32.0") == (plain, ())


def test_the_simulator_refuses_and_the_gateway_adapts(certs: Any) -> None:
    """The simulator refuses encrypted reasoning as vLLM does; through the gateway, a `kind:
    vllm` backend gets it left out (counted), a `kind: openai` one the original (its 400)."""
    import httpx

    from loadtests.harness.gateway import GatewayServer, coder_policy
    from loadtests.harness.sim import SimServer
    from tests.engines.vllm.common import logged

    body = {**_body(BLOB, CALL), "model": "coder", "stream": False, "max_output_tokens": 8}
    with SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.05) as sim:
        direct = httpx.post(f"{sim.url}/v1/responses", json={**body, "model": "qwen3.8-27b"})
        assert direct.status_code == 400
        assert direct.json()["error"]["param"] == "input"
        assert vllm_wire.ENCRYPTED_REASONING_ERROR in direct.json()["error"]["message"]
        doc = coder_policy({"coder-a": sim.url})
        doc["backends"]["plain"] = {**doc["backends"]["coder-a"], "kind": "openai"}
        doc["routes"]["plain"] = {"models": ["plain"], "variants": ["plain"]}
        with GatewayServer(doc, certs=certs) as gw, gw.client() as c:
            adapted = c.post("/v1/responses", json=body)
            assert adapted.status_code == 200, adapted.text
            kept = c.post("/v1/responses", json={**body, "model": "plain"})
            assert kept.status_code == 400 and kept.json() == direct.json()
            counted = [
                line.split("{")[1]
                for line in gw.metrics().splitlines()
                if line.startswith("specrouter_adaptations_total{")
            ]
            assert counted == ['backend="coder-a",rule="responses-encrypted-reasoning"} 1.0']
            rows = [logged(gw, r.headers["x-request-id"]) for r in (adapted, kept)]
            assert [row["adapted"] for row in rows] == ["responses-encrypted-reasoning", None]


def test_candidates_read_on_the_parsed_body_say_exactly_when_a_rule_edits() -> None:
    """`candidates` (read before the tree is released) names a rule exactly when its edit
    changes the body: with them, `adapt` skips scanning a released body's bytes, and answers
    the same as without them."""
    bodies = [
        _body(BLOB, CALL),
        _body(SUMMARISED),
        _body(READABLE, CALL),
        _body({**BLOB, "encrypted_content": ""}),  # an empty blob: nothing to leave out
        _body({**BLOB, "type": "message"}),  # not a reasoning item
        {"model": "m", "input": ["a string item", 3, None, BLOB]},
        {"model": "m", "input": "one prompt"},
        {"model": "m"},
    ]
    for body in bodies:
        names = candidates(body, "responses")
        edits = {r.name for r in RULES if r.endpoint == "responses" and r.edit(body) is not None}
        assert names == edits, body
        released = {**body}
        if isinstance(body.get("input"), list):
            released["input"] = memoryview(orjson.dumps(body["input"]))
        with_hint = adapt(released, "responses", "vllm", "0.32.0", names)
        assert with_hint[1] == adapt(released, "responses", "vllm", "0.32.0")[1]
        assert orjson.dumps(with_hint[0]["input"] if with_hint[1] else body.get("input")) == (
            orjson.dumps(adapt(body, "responses", "vllm", "0.32.0")[0].get("input"))
        )
    assert candidates(_body(BLOB), "chat") == frozenset()  # another endpoint: no rule's
    # the hint is taken as it is: a body it names no rule for is not read again
    released = {"model": "m", "input": memoryview(orjson.dumps([BLOB]))}
    assert adapt(released, "responses", "vllm", "0.32.0", frozenset()) == (released, ())


def _msg(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


DEV = _msg("developer", "instructions")
DEV_LATE = _msg("developer", "<permissions>read-only</permissions>")
SYS_LATE = {"role": "system", "content": "later system"}  # an easy input message (no type)
USER = _msg("user", "list the files")


@pytest.mark.parametrize(
    ("items", "moved"),
    [
        # Codex's resumed turn: leading developer messages stay, the late one becomes `user`
        ([DEV, DEV, USER, CALL, DEV_LATE, USER], [4]),
        # a late system message moves too when the body holds a developer message (vLLM
        # merges every system message once it converts one)
        ([DEV, USER, SYS_LATE, CALL], [2]),
        ([DEV, USER, CALL, DEV_LATE, DEV_LATE], [3, 4]),
        # a function call or reasoning item begins the thread as a message does
        ([CALL, DEV_LATE], [1]),
        ([READABLE, DEV_LATE], [1]),
        # nothing moves: only leading ones, no developer message at all, not a list
        ([DEV, DEV, USER, CALL], []),
        ([{"role": "system", "content": "s"}, USER, SYS_LATE], []),
        ([USER, {"type": "function_call_output", "role": "developer", "output": "x"}], []),
        ([], []),
    ],
)
def test_developer_in_place_table(items: list[Any], moved: list[int]) -> None:
    """`developer_in_place` (opt-in): which messages go as `user`, in place, for Responses'
    `input` and chat's `messages`; everything else of the body as it was."""
    pairs: tuple[tuple[Endpoint, str], ...] = (("responses", "input"), ("chat", "messages"))
    for endpoint, field in pairs:
        body = {"model": "m", field: items, "stream": True}
        out, applied = adapt(body, endpoint, "vllm", "0.28.0", opted_in=True)
        name = f"{endpoint}-developer-in-place"
        assert applied == ((name,) if moved else ()), (endpoint, items)
        assert candidates(body, endpoint, opted_in=True) == ({name} if moved else set())
        if not moved:
            assert out is body
            continue
        assert [i for i, item in enumerate(out[field]) if item is not items[i]] == moved
        for i in moved:
            assert out[field][i] == {**items[i], "role": "user"}
        assert body[field] is items  # the client's body is not changed in place
        assert DEV_LATE["role"] == "developer" and SYS_LATE["role"] == "system"
        # from a released body's bytes (exchange.release_tree), the same edit
        released = {**body, field: memoryview(orjson.dumps(items))}
        again, _ = adapt(released, endpoint, "vllm", "0.28.0", opted_in=True)
        assert orjson.dumps(again[field]) == orjson.dumps(out[field])


def test_developer_in_place_is_off_unless_the_backend_asks() -> None:
    body = {"model": "m", "input": [DEV, USER, DEV_LATE]}
    assert adapt(body, "responses", "vllm", "0.32.0") == (body, ())
    assert candidates(body, "responses") == frozenset()  # the policy has no such backend
    for kind in ("openai", "llamacpp"):
        assert adapt(body, "responses", kind, "0.32.0", opted_in=True) == (body, ())
