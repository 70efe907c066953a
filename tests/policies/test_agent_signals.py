"""The agents' own signals (policies/agent_signals.py): headers in, bounded values out, one row
per case; and the rule they feed: a compaction or auxiliary request never moves its session
(decide(), `keeps_place`), while it grants nothing else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from policies.agent_signals import (
    MAX_DURATIONS,
    MAX_METADATA_BYTES,
    MAX_NAME_CHARS,
    REQUEST_CLASSES,
    AgentSignals,
    signals_of,
)
from policies.engine import decide
from policies.inputs import request_view
from policies.types import RequestView, SessionView
from tests.policies.test_stickiness import BUSY, LOAD, policy, session, state

TURN_META = (
    b'{"session_id":"01a2","thread_id":"01a2","turn_id":"01a23384-fabe-7f72",'
    b'"request_kind":"turn","sandbox":"seccomp","model":"qwen3.8-27b"}'
)


@dataclass
class Parse:
    id: str
    headers: dict[bytes, bytes]
    want: dict[str, Any]  # AgentSignals fields expected (the others: their defaults)


PARSES = [
    Parse("nothing", {}, {}),
    Parse("unrelated-headers", {b"x-request-id": b"r1"}, {}),
    *(
        Parse(f"class-{c}", {b"x-claude-code-request-class": c.encode()}, {"request_class": c})
        for c in REQUEST_CLASSES
        if c != "other"
    ),
    Parse(
        "class-case-and-space",
        {b"x-claude-code-request-class": b" Compaction "},
        {"request_class": "compaction"},
    ),
    Parse(
        "class-unknown-is-other",
        {b"x-claude-code-request-class": b"vip"},
        {"request_class": "other"},
    ),
    Parse(
        "class-free-text-is-other",
        {b"x-claude-code-request-class": b"main; drop table" * 50},
        {"request_class": "other"},
    ),
    Parse("class-empty", {b"x-claude-code-request-class": b""}, {}),
    Parse(
        "agent-type-sanitized-and-cut",
        {b"x-claude-code-agent-type": b"General-Purpose <script>" + b"x" * 200},
        {"agent_type": ("general-purposescript" + "x" * 200)[:MAX_NAME_CHARS]},
    ),
    Parse(
        "compaction-header-alone",
        {b"x-claude-code-compaction": b"auto"},
        {"request_class": "compaction", "compaction": "auto"},
    ),
    Parse(
        "compaction-header-false", {b"x-claude-code-compaction": b"false"}, {"compaction": "false"}
    ),
    Parse(
        "class-wins-over-compaction-header",
        {b"x-claude-code-request-class": b"main", b"x-claude-code-compaction": b"auto"},
        {"request_class": "main", "compaction": "auto"},
    ),
    Parse(
        "context-compacted-true",
        {b"x-claude-code-context-compacted": b"true"},
        {"context_compacted": True},
    ),
    Parse(
        "context-compacted-other",
        {b"x-claude-code-context-compacted": b"nope"},
        {"context_compacted": False},
    ),
    Parse(
        "durations-numbers-only-capped",
        {b"x-claude-code-prev-tool-durations": b"120, 3.5,abc,9999999;-4"},
        {"prev_tool_durations": (120.0, 3.5, 86400.0, 4.0)},
    ),
    Parse(
        "durations-at-most-16",
        {b"x-claude-code-prev-tool-durations": b",".join(b"%d" % i for i in range(100))},
        {"prev_tool_durations": tuple(float(i) for i in range(MAX_DURATIONS))},
    ),
    Parse(
        "codex-subagent-review",
        {b"x-openai-subagent": b"review"},
        {"request_class": "subagent", "agent_type": "review"},
    ),
    Parse(
        "codex-subagent-compact",
        {b"x-openai-subagent": b"compact"},
        {"request_class": "compaction", "agent_type": "compact"},
    ),
    Parse(
        "codex-subagent-label-is-other",
        {b"x-openai-subagent": b"my-own-label"},
        {"request_class": "subagent", "agent_type": "other"},
    ),
    Parse(
        "codex-turn-metadata",
        {b"x-codex-turn-metadata": TURN_META},
        {"request_class": "main", "turn_id": "HASH"},
    ),
    Parse(
        "codex-metadata-compact-kind",
        {b"x-codex-turn-metadata": b'{"turn_id":"t1","request_kind":"compact_remote"}'},
        {"request_class": "compaction", "turn_id": "HASH"},
    ),
    Parse("codex-metadata-not-json", {b"x-codex-turn-metadata": b"{turn_id: 1"}, {}),
    Parse("codex-metadata-not-object", {b"x-codex-turn-metadata": b'["turn_id"]'}, {}),
    Parse(
        "codex-metadata-too-long-not-parsed",
        {b"x-codex-turn-metadata": b'{"turn_id":"t1","pad":"' + b"x" * MAX_METADATA_BYTES + b'"}'},
        {},
    ),
    Parse("prompt-id-hashed", {b"x-claude-code-prompt-id": b"prompt-42"}, {"prompt_id": "HASH"}),
]


@pytest.mark.parametrize("case", PARSES, ids=[c.id for c in PARSES])
def test_parse(case: Parse) -> None:
    got = signals_of("agent", case.headers)
    want = AgentSignals(**{k: v for k, v in case.want.items() if v != "HASH"})
    for name in AgentSignals.__slots__:
        expected = case.want.get(name, getattr(want, name))
        value = getattr(got, name)
        if expected == "HASH":  # a hash of the id with the client: bounded, never the raw id
            assert len(value) == 18 and value[:2] in ("p-", "t-") and value[2:].isalnum(), value
        else:
            assert value == expected, (name, value)


def test_ids_are_scoped_by_client_and_never_raw() -> None:
    headers = {b"x-claude-code-prompt-id": b"prompt-42", b"x-codex-turn-metadata": TURN_META}
    mine, theirs = signals_of("agent", headers), signals_of("other", headers)
    assert mine.prompt_id != theirs.prompt_id and mine.turn_id != theirs.turn_id
    assert mine == signals_of("agent", dict(headers))  # stable: one prompt groups its requests
    assert "prompt-42" not in repr(mine) and "01a23384" not in repr(mine)


def test_every_stored_value_is_bounded_whatever_is_sent() -> None:
    huge = b"\xff\x00<>" * 10_000
    names = (
        b"x-claude-code-request-class",
        b"x-claude-code-agent-type",
        b"x-claude-code-compaction",
        b"x-claude-code-context-compacted",
        b"x-claude-code-prev-tool-durations",
        b"x-claude-code-prompt-id",
        b"x-openai-subagent",
        b"x-codex-turn-metadata",
    )
    got = signals_of("agent", dict.fromkeys(names, huge))
    assert got.request_class in REQUEST_CLASSES
    for text in (got.agent_type, got.compaction):
        assert len(text) <= MAX_NAME_CHARS and text.isascii()
    assert len(got.durations_text) <= MAX_DURATIONS * 16


# The rule: a compaction or auxiliary request stays where its session is ---------------------


@dataclass
class Keep:
    id: str
    keeps_place: bool
    session: SessionView | None
    live: Any
    backend: str
    reason: str


KEEPS = [
    # held on b, the rules say a and a move pays (see test_stickiness): a main turn moves ...
    Keep(
        "main-turn-moves",
        False,
        session("b", prefix_tokens=20_000, out_tokens_per_turn=500),
        state(),
        "a",
        "session-move",
    ),
    # ... a compaction or auxiliary request stays
    Keep(
        "compaction-stays",
        True,
        session("b", prefix_tokens=20_000, out_tokens_per_turn=500),
        state(),
        "b",
        "session",
    ),
    Keep("held-agrees", True, session("a", prefix_tokens=5000), state(), "a", "quiet"),
    # the held engine cannot serve: served where it can be (the caller does not move the row)
    Keep(
        "held-down-served-elsewhere",
        True,
        session("a", prefix_tokens=5000),
        state(a="down"),
        "b",
        "health",
    ),
    # no session row yet: the rules place it, nothing is held
    Keep("new-session-rules", True, session(None), BUSY, "b", "quiet"),
    Keep("no-session", True, None, BUSY, "b", "quiet"),
]


@pytest.mark.parametrize("row", KEEPS, ids=[r.id for r in KEEPS])
def test_keeps_place_never_moves(row: Keep) -> None:
    view = RequestView(
        endpoint="chat",
        model="coder",
        client="agent",
        session=row.session,
        keeps_place=row.keeps_place,
    )
    d = decide(view, row.live, policy([LOAD]))
    assert (d.backend, d.reason) == (row.backend, row.reason)


def test_request_view_reads_the_class_from_the_headers() -> None:
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
    for cls, keeps in (
        ("compaction", True),
        ("auxiliary", True),
        ("main", False),
        ("subagent", False),
    ):
        view = request_view(
            body, "chat", "coder", "agent", {b"x-claude-code-request-class": cls.encode()}, 0.0
        )
        assert view.keeps_place is keeps, cls


def test_a_declared_class_grants_no_priority() -> None:
    """`subagent` as a class is a record, not the parent headers' subagent: no priority."""
    p = policy([LOAD], subagent_priority=-5)
    body = {"model": "coder", "messages": [{"role": "user", "content": "hi"}]}
    headers = {b"x-claude-code-session-id": b"s1", b"x-claude-code-request-class": b"subagent"}
    view = request_view(body, "chat", "coder", "agent", headers, 0.0)
    assert view.session is not None and not view.session.subagent
    d = decide(view, BUSY, p)  # on b, the priority-scheduling engine: the client's priority
    assert (d.backend, d.priority) == ("b", 3)
