"""The session a vLLM request's KV blocks are tagged with (proxy/relay/owned.py) and how each
release reads it (proxy/vllm_wire.py `engine_session`): tables, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from proxy import vllm_wire
from proxy.relay.owned import refused, session_fields

KEY = "s-0123456789abcdef0123456789abcdef"
MSG = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "endpoint", "kind", "version", "session", "want_body", "want_inject"),
    [
        # the client's field replaced by the gateway's key where the release reads it
        ({**MSG, "session_id": "mine"}, "chat", "vllm", "0.32.0", KEY, MSG, {"session_id": KEY}),
        (MSG, "chat", "vllm", "0.30.0", KEY, MSG, {"session_id": KEY}),
        (MSG, "responses", "vllm", "0.33.0", KEY, MSG, {"session_id": KEY}),
        # no session: the client's field only left out
        ({**MSG, "session_id": "mine"}, "completions", "vllm", "0.32.0", "", MSG, {}),
        # Messages has no such field (the header carries it); 0.28/0.29 read none
        ({**MSG, "session_id": "mine"}, "messages", "vllm", "0.33.0", KEY, MSG, {}),
        ({**MSG, "session_id": "mine"}, "chat", "vllm", "0.28.0", KEY, MSG, {}),
        (MSG, "chat", "vllm", "0.29.0", KEY, MSG, {}),
        # another engine kind: not vLLM's field, untouched
        (
            {**MSG, "session_id": "mine"},
            "chat",
            "sglang",
            "0.32.0",
            KEY,
            {**MSG, "session_id": "mine"},
            {},
        ),
    ],
)
def test_session_fields(
    body: dict[str, Any],
    endpoint: str,
    kind: Any,
    version: str,
    session: str,
    want_body: dict[str, Any],
    want_inject: dict[str, Any],
) -> None:
    before = dict(body)
    out, inject = session_fields(body, endpoint, kind, version, session)
    assert (out, inject) == (want_body, want_inject)
    assert body == before  # the client's body itself is not edited


@pytest.mark.parametrize(
    ("xargs", "param_key"),
    [
        ({"session_id": "other"}, "session_id"),
        ({"kv_cache_report_mode": "full"}, "kv_cache_report_mode"),
        ({"my_logits_arg": 1, "kv_cache_report_mode": "incremental"}, "kv_cache_report_mode"),
        ({"my_logits_arg": 1}, None),
        ("not an object", None),  # the engine's to refuse
    ],
)
def test_refused_xargs(xargs: Any, param_key: str | None) -> None:
    got = refused({**MSG, "vllm_xargs": xargs})
    if param_key is None:
        assert got is None
    else:
        assert got is not None and got[1] == "vllm_xargs" and f"vllm_xargs.{param_key}" in got[0]
    assert refused(MSG) is None


@pytest.mark.parametrize(
    ("version", "endpoint", "body", "header", "want"),
    [
        ("0.32.0", "chat", {"session_id": "b"}, "h", "b"),  # the body first
        ("0.32.0", "chat", {"vllm_xargs": {"session_id": "x"}}, "h", "h"),  # then the header
        ("0.32.0", "chat", {"vllm_xargs": {"session_id": "x"}}, None, "x"),  # then xargs
        ("0.32.0", "messages", {"session_id": "b"}, "h", "h"),  # Messages: no body field
        ("0.32.0", "completions", {"session_id": ""}, None, None),
        ("0.28.0", "chat", {"session_id": "b"}, "h", None),  # no tags before 0.30.0
    ],
)
def test_engine_session(
    version: str, endpoint: str, body: dict[str, Any], header: str | None, want: str | None
) -> None:
    assert vllm_wire.engine_session(version, endpoint, body, header) == want
