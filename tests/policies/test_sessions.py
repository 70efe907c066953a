"""Session identity (policies/sessions.py): one table row per case, headers -> key and kind."""

from __future__ import annotations

from typing import Any

import pytest

from policies.inputs import request_view
from policies.sessions import FINGERPRINT_PARTS, SessionId, fingerprint, session_of

SYSTEM = "You are a coding agent."
BILLING = "x-anthropic-billing-header: cc_version=2.1.80.a1b; cc_entrypoint=cli; cch={};"


def chat(*turns: str, system: str = SYSTEM) -> dict[str, Any]:
    roles = ("user", "assistant")
    return {
        "model": "m",
        "messages": [{"role": "system", "content": system}]
        + [{"role": roles[i % 2], "content": t} for i, t in enumerate(turns)],
    }


def messages(cch: str, *turns: str) -> dict[str, Any]:
    """Claude Code's shape: system blocks, the attribution block first, its hash per request."""
    body = chat(*turns)
    body["messages"] = body["messages"][1:]
    body["system"] = [
        {"type": "text", "text": BILLING.format(cch)},
        {"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}},
    ]
    return body


def sid(
    body: dict[str, Any], headers: dict[bytes, bytes] | None = None, client: str = "agent"
) -> SessionId | None:
    return session_of(client, body, headers or {})


@pytest.mark.parametrize(
    ("headers", "body", "source", "subagent"),
    [
        ({b"x-claude-code-session-id": b"cc-1"}, chat("hi"), "header", False),
        (
            {
                b"x-claude-code-session-id": b"cc-1",
                b"x-claude-code-agent-id": b"sub-1",
                b"x-claude-code-parent-agent-id": b"main",
            },
            chat("hi"),
            "header",
            True,
        ),
        ({b"thread-id": b"t-1"}, chat("hi"), "header", False),
        ({b"session_id": b"t-1", b"x-openai-subagent": b"review"}, chat("hi"), "header", True),
        ({b"session-id": b"t-1", b"x-codex-parent-thread-id": b"t-0"}, chat("hi"), "header", True),
        ({b"x-session-id": b"oc-1", b"x-parent-session-id": b"oc-0"}, chat("hi"), "header", True),
        ({}, {**chat("hi"), "user": "u-1"}, "user", False),
        ({}, chat("hi"), "fingerprint", False),
    ],
)
def test_source_and_subagent(
    headers: dict[bytes, bytes], body: dict[str, Any], source: str, subagent: bool
) -> None:
    found = sid(body, headers)
    assert found is not None
    assert (found.source, found.subagent) == (source, subagent)
    assert found.key.startswith("s-") and len(found.key) == 34


def test_header_beats_user_beats_fingerprint() -> None:
    body = {**chat("hi"), "user": "u-1"}
    by_header = sid(body, {b"x-claude-code-session-id": b"cc-1"})
    by_user = sid(body)
    assert by_header is not None and by_user is not None
    assert by_header.key != by_user.key and by_user.source == "user"


def test_scoped_by_client() -> None:
    headers = {b"x-claude-code-session-id": b"cc-1"}
    a, b = sid(chat("hi"), headers, "alice"), sid(chat("hi"), headers, "bob")
    assert a is not None and b is not None and a.key != b.key


def test_agent_within_a_session_has_its_own_key() -> None:
    main = sid(chat("hi"), {b"x-claude-code-session-id": b"cc-1"})
    sub = sid(chat("hi"), {b"x-claude-code-session-id": b"cc-1", b"x-claude-code-agent-id": b"a"})
    assert main is not None and sub is not None
    assert main.key != sub.key and main.agent == "" and len(sub.agent) == 8


def test_bounded_whatever_the_client_sends() -> None:
    hostile = {b"x-claude-code-session-id": b"\xff\x00\r\n" * 10_000}
    found = sid(chat("hi"), hostile)
    assert found is not None and len(found.key) == 34 and found.key[2:].isalnum()
    # cut at 256 bytes: a longer id with the same start is the same session
    longer = {b"x-claude-code-session-id": b"\xff\x00\r\n" * 20_000}
    assert sid(chat("hi"), longer) == found


def test_fingerprint_follows_one_conversation_across_turns() -> None:
    first, later = sid(chat("fix it")), sid(chat("fix it", "done", "now test it"))
    other = sid(chat("write docs", "done", "now test it"))
    other_system = sid(chat("fix it", "done", "x", system="You are a poet."))
    assert first is not None and later is not None and other is not None
    assert first.key == later.key
    assert other.key != first.key and other_system is not None and other_system.key != first.key
    # only a request carrying history continues a fingerprinted session
    assert (first.continues, later.continues) == (False, True)


def test_fingerprint_skips_claude_codes_billing_block() -> None:
    one, two = sid(messages("a1b2c", "fix it")), sid(messages("f9e8d", "fix it", "ok", "more"))
    assert one is not None and two is not None and one.key == two.key


def test_fingerprint_reads_a_bounded_prefix_of_a_long_content_list() -> None:
    # 100,000 parts (a 7 MB list): the parts past the bound are not read, so they do not count.
    def turn(*texts: str) -> dict[str, Any]:
        body = chat("")
        body["messages"][1]["content"] = [{"type": "text", "text": t} for t in texts]
        return body

    head = [f"part {i}" for i in range(FINGERPRINT_PARTS)]
    one, two = (
        fingerprint(turn(*head, *["a"] * 100_000)),
        fingerprint(turn(*head, *["b"] * 100_000)),
    )
    assert one is not None and one == two
    assert fingerprint(turn(*head[:2])) != one


def test_fingerprint_of_responses_and_no_user_turn() -> None:
    turn1 = {"model": "m", "instructions": SYSTEM, "input": "fix it"}
    turn2 = {
        "model": "m",
        "instructions": SYSTEM,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            {"role": "user", "content": "more"},
        ],
    }
    a, b = sid(turn1), sid(turn2)
    assert a is not None and b is not None and a.key == b.key and b.continues
    assert fingerprint({"model": "m", "messages": [{"role": "system", "content": "x"}]}) is None
    assert sid({"model": "m", "prompt": "x"}) is None


def test_canary_key_is_the_session() -> None:
    headers = {b"x-claude-code-session-id": b"cc-1"}
    v1 = request_view(chat("a"), "chat", "m", "agent", headers, 0.0)
    v2 = request_view(chat("b", "c", "d"), "chat", "m", "agent", headers, 0.0)
    v3 = request_view(chat("a"), "chat", "m", "agent", {b"x-claude-code-session-id": b"cc-2"}, 0.0)
    assert v1.session is not None and v1.session.key == sid(chat("a"), headers).key  # type: ignore[union-attr]
    assert v1.canary_bucket == v2.canary_bucket != v3.canary_bucket
    embed = request_view(
        {"model": "e", "input": "x", "user": "u"}, "embeddings", "e", "agent", {}, 0.0
    )
    assert embed.session is None


def test_a_caller_that_found_no_session_is_not_fingerprinted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The gateway identifies the session before the view (proxy/relay/app.py): a headerless
    # first turn is fingerprinted once, not once more here.
    calls: list[str] = []
    monkeypatch.setattr(
        "policies.inputs.session_of", lambda client, *_: calls.append(client) or None
    )
    view = request_view(chat("hi"), "chat", "m", "agent", {}, 0.0, None, identified=True)
    assert view.session is None and calls == []
    request_view(chat("hi"), "chat", "m", "agent", {}, 0.0)
    assert calls == ["agent"]
