"""Per-turn prefix accounting (proxy/backends/prefix.py): the comparison of a turn's conversation
with its session's previous one on the bytes `check_fields` wrote, the arithmetic of what was
lost and why, the byte budget, and what it finds on the recorded agent sessions."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from policies.agent_signals import signals_of
from policies.sessions import session_of
from proxy.backends.kv_index import Residency
from proxy.backends.prefix import Baselines, Check, PrefixLoss, account, conversation_of
from proxy.relay.fields import DEFAULT_LIMITS, check_fields
from tests.engines.vllm.replay import load, sessions


def _encoded(endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    encoded: dict[str, Any] = {}
    assert check_fields(endpoint, body, DEFAULT_LIMITS, encoded) is None
    return encoded


def _check(b: Baselines, endpoint: str, body: dict[str, Any], key: str = "s-1") -> Check:
    body = orjson.loads(orjson.dumps(body))  # as parsed from the wire
    check = b.check(key, endpoint, body, _encoded(endpoint, body))
    assert check is not None
    body.clear()  # the tree freed once decided, as on the request path: the bytes are enough
    return check


THREAD: dict[str, Any] = {
    "model": "m",
    "system": [{"type": "text", "text": "You are a coding agent."}],
    "tools": [{"name": "bash", "input_schema": {"type": "object"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "list the files"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "ls"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "a.py", "cache_control": {"type": "ephemeral"}}],
        },
    ],
    "max_tokens": 10,
}


def _next_turn(**change: Any) -> dict[str, Any]:
    """The thread one turn on, as Claude Code sends it: its breakpoint moved to the newest."""
    body = copy.deepcopy(THREAD)
    del body["messages"][2]["content"][0]["cache_control"]
    body["messages"] += [
        {"role": "assistant", "content": [{"type": "text", "text": "cat a.py"}]},
        {
            "role": "user",
            "content": [{"type": "text", "text": "x=1", "cache_control": {"type": "ephemeral"}}],
        },
    ]
    body.update(change)
    return body


@pytest.mark.parametrize(
    ("change", "extends", "where"),
    [
        ({}, True, ""),  # a moved `cache_control` is not rendered: still the same prefix
        ({"system": [{"type": "text", "text": "You are an agent. 12:01"}]}, False, "system"),
        ({"tools": []}, False, "tools"),
        (
            {"messages": [{"role": "user", "content": "list the files!"}, *THREAD["messages"][1:]]},
            False,
            "messages[0]",
        ),
        ({"messages": THREAD["messages"][:1]}, False, "messages[1]"),  # shorter: compacted away
        # a late item edited (named from the list's end)
        (
            {"messages": [*THREAD["messages"][:2], {"role": "user", "content": "b.py"}]},
            False,
            "messages[2]",
        ),
    ],
)
def test_compare_names_the_first_change(change: dict[str, Any], extends: bool, where: str) -> None:
    b = Baselines()
    b.finished("s-1", _check(b, "messages", THREAD), "e", 1000, 0)
    check = _check(b, "messages", _next_turn(**change))
    assert (check.extends, check.where) == (extends, where)
    assert check.prev_prompt == 1000 and (check.share == 1.0) == extends


def test_chat_and_responses_are_compared_on_their_own_fields() -> None:
    b = Baselines()
    chat = {"model": "m", "messages": [{"role": "system", "content": "s"}]}
    b.finished("c", _check(b, "chat", chat, "c"), "e", 100, 0)
    more = {**chat, "messages": [*chat["messages"], {"role": "user", "content": "u"}]}
    assert _check(b, "chat", more, "c").extends
    resp = {"model": "m", "instructions": "be brief", "input": [{"role": "user", "content": "u"}]}
    b.finished("r", _check(b, "responses", resp, "r"), "e", 100, 0)
    assert _check(b, "responses", {**resp, "instructions": "be long"}, "r").where == "instructions"
    # a string input, or a completion, is no conversation to compare
    assert b.check("r", "responses", {"input": "hi"}, {}) is None
    chained = {**resp, "previous_response_id": "resp_1"}  # carries only the new items
    assert b.check("r", "responses", chained, _encoded("responses", chained)) is None
    assert conversation_of("completions", {"prompt": "x"}, {}) is None


def test_a_session_that_changes_api_starts_again() -> None:
    """One session's turns on chat, then Messages, then chat again: each API's lead fields
    differ, so a turn on another API than its previous one is not compared (no previous turn),
    and the next turn on the same API is compared with it."""
    b = Baselines()
    chat = {"model": "m", "messages": [{"role": "user", "content": "u"}]}
    b.finished("s", _check(b, "chat", chat, "s"), "e", 100, 0)
    on_messages = _check(b, "messages", THREAD, "s")
    assert (on_messages.prev_prompt, on_messages.extends) == (0, False)
    b.finished("s", on_messages, "e", 1000, 0)
    assert _check(b, "chat", chat, "s").prev_prompt == 0
    assert _check(b, "messages", _next_turn(), "s").extends


def _c(
    prev: int,
    extends: bool = True,
    share: float = 1.0,
    where: str = "",
    resident: Residency | None = None,
) -> Check:
    compared = (extends, where, share)
    return Check(None, None, prev, "e", resident, compared=compared)  # type: ignore[arg-type]


def _r(blocks: int, chain: int = 62, resets: int = 0) -> Residency:
    """What the engine's KV events say of the session (16-token blocks)."""
    return Residency(blocks, chain, 16, resets)


@pytest.mark.parametrize(
    ("check", "engine", "prompt", "cached", "compacted", "loss"),
    [
        # whole blocks of the previous prompt found: nothing lost
        (_c(1000), "e", 1200, 992, False, PrefixLoss(992, 0, "")),
        # the body extends it, the engine served less: the engine's side, unknown here
        (_c(1000), "e", 1200, 512, False, PrefixLoss(992, 480, "unknown")),
        # a rewrite at a fifth of the way: expected up to it, the rest the client's
        (
            _c(1000, False, 0.2, "system"),
            "e",
            1200,
            192,
            False,
            PrefixLoss(192, 800, "client-rewrite", "system"),
        ),
        (
            _c(1000, False, 0.1, "messages[1]"),
            "e",
            300,
            96,
            True,
            PrefixLoss(16, 192, "compacted", "messages[1]"),
        ),
        # the engine's KV events tell its side apart: the session's blocks gone before this
        # turn, still there but not served, a reset since; events that do not cover the
        # previous prompt (a chain of 10 blocks for 992 tokens) decide nothing
        (_c(1000, resident=_r(32)), "e", 1200, 512, False, PrefixLoss(992, 480, "evicted")),
        (
            _c(1000, resident=_r(62)),
            "e",
            1200,
            512,
            False,
            PrefixLoss(992, 480, "engine-rendering"),
        ),
        (
            _c(1000, resident=_r(0, resets=1)),
            "e",
            1200,
            0,
            False,
            PrefixLoss(992, 992, "engine-reset"),
        ),
        (_c(1000, resident=_r(10, 10)), "e", 1200, 160, False, PrefixLoss(992, 832, "unknown")),
        # the client's rewrite stays its own, whatever the engine holds
        (
            _c(1000, False, 0.2, "system", _r(0, resets=1)),
            "e",
            1200,
            192,
            False,
            PrefixLoss(192, 800, "client-rewrite", "system"),
        ),
        # the same prompt again: vLLM computes its last token, so one block less is held
        (_c(1024), "e", 1024, 1008, False, PrefixLoss(1008, 0, "")),
        # another engine, no previous turn, no usage: nothing to account
        (_c(1000), "other", 1200, 0, False, PrefixLoss(0, 0, "")),
        (_c(0), "e", 1200, 0, False, PrefixLoss(0, 0, "")),
        (_c(1000), "e", 1200, None, False, PrefixLoss(0, 0, "")),
    ],
)
def test_account_table(
    check: Check, engine: str, prompt: int, cached: int | None, compacted: bool, loss: PrefixLoss
) -> None:
    assert account(check, engine, prompt, cached, block=16, compacted=compacted) == loss


def test_compaction_marks_the_next_turn_and_budget_bounds_the_bytes() -> None:
    b = Baselines()
    b.finished("s-1", _check(b, "messages", THREAD), "e", 1000, 0)
    b.compacted("s-1")
    short = {**THREAD, "messages": [{"role": "user", "content": "summary of the work so far"}]}
    loss = b.finished("s-1", _check(b, "messages", short), "e", 300, 16)
    assert (loss.cause, loss.where) == ("compacted", "messages[0]")
    small = Baselines(budget=1)  # every baseline over it: none kept
    small.finished("s-1", _check(small, "messages", THREAD), "e", 1000, 0)
    assert len(small) == 0 and small.held == 0
    assert _check(small, "messages", THREAD).prev_prompt == 0
    assert len(b) == 1 and b.held > 0


EP = {"chat/completions": "chat", "responses": "responses", "messages": "messages"}


def test_the_recorded_agents_rewrites() -> None:
    """Each recorded session's turns, in order, through the real session key and comparison:
    where a turn does not extend its session's previous one. Claude Code moves its
    `cache_control` breakpoint every turn (not rendered: skipped); what is left is listed with
    its reason in docs/sessions.md."""
    b, found = Baselines(), []
    for name in sessions():
        for r in load(name):
            endpoint = EP.get(r.endpoint)
            if endpoint is None:
                continue
            body = orjson.loads(r.body)
            headers = {k.lower().encode(): v.encode() for k, v in r.headers}
            sid = session_of("c", body, headers)
            assert sid is not None
            check = b.check(sid.key, endpoint, body, _encoded(endpoint, body))
            assert check is not None
            if check.prev_prompt and not check.extends:
                found.append((r.name, check.where))
            if not signals_of("c", headers).keeps_place:
                b.finished(sid.key, check, "e", 1000, 0)
    assert found == [
        ("claude-code#2", "system"),  # after the title request, which shares the session id
        ("codex-encrypted#0", "input[4]"),  # the same thread recorded again, reasoning encrypted
    ]
