"""GET /v1/models' windows, sans-io: the policy's `engine.max_model_len` first, else what the
engines reported; the smallest of every backend that may answer a name."""

from __future__ import annotations

from typing import Any

from loadtests.harness.gateway import coder_policy
from policies.compiled import compile_policy
from policies.spec.document import PolicyDocument
from proxy.backends.engines import EngineTable
from proxy.relay.models_list import model_list
from proxy.settings import Settings


def _listed(doc: dict[str, Any], reported: dict[str, int]) -> dict[str, Any]:
    engines = EngineTable()
    for url, window in reported.items():
        engines.state(url).max_model_len = window
    policy = compile_policy(PolicyDocument.model_validate(doc))
    return model_list(policy, engines, Settings(first_byte_timeout_s=100.0), created=0)


def _windows(listed: dict[str, Any]) -> dict[str, Any]:
    return {m["id"]: m["max_model_len"] for m in listed["data"]}


def test_the_policys_window_wins_and_the_smallest_variant_gives_the_names() -> None:
    doc = coder_policy({"a": "http://a:1", "b": "http://b:1"})
    doc["backends"]["a"]["engine"] = {"max_model_len": 131072}
    listed = _listed(doc, {"http://a:1": 262144, "http://b:1": 65536})
    assert _windows(listed) == {"coder": 65536, "qwen3.8-27b": 65536}
    assert listed["first_token_limit_s"] == 30 + 100


def test_a_fallback_counts_and_an_engine_not_read_yet_is_left_out() -> None:
    doc = coder_policy({"a": "http://a:1", "b": "http://b:1"})
    doc["routes"]["coder"]["fallback"] = "b"
    assert _windows(_listed(doc, {})) == {"coder": None, "qwen3.8-27b": None}
    assert _windows(_listed(doc, {"http://a:1": 131072})) == {
        "coder": 131072,
        "qwen3.8-27b": 131072,
    }
    both = _listed(doc, {"http://a:1": 131072, "http://b:1": 32768})
    assert _windows(both)["coder"] == 32768


def test_a_held_session_adds_its_wait_to_the_first_token_limit() -> None:
    doc = coder_policy({"a": "http://a:1"})
    doc["admission"] = {"queue_timeout_s": 10, "sessions": {"enabled": True, "stream_wait_s": 50}}
    assert _listed(doc, {})["first_token_limit_s"] == 10 + 50 + 100
