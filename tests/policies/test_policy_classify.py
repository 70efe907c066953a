"""The content classifier: signals -> class, and bodies -> signals."""

from __future__ import annotations

import re
from typing import Any

import pytest

from policies.classify import SCAN_CHARS, SCAN_PARTS, classify, signals_from_body
from policies.types import ContentSignals


@pytest.mark.parametrize(
    ("signals", "expected"),
    [
        (ContentSignals(), "prose"),
        (ContentSignals(tools_declared=True), "code"),
        (ContentSignals(code_in_recent_messages=True), "code"),
        (ContentSignals(system_prompt_mentions_code=True), "code"),
    ],
)
def test_classify(signals: ContentSignals, expected: str) -> None:
    assert classify(signals) == expected


def user(text: Any) -> dict[str, Any]:
    return {"role": "user", "content": text}


TOOLS = ContentSignals(tools_declared=True)
RECENT = ContentSignals(code_in_recent_messages=True)
SYSTEM = ContentSignals(system_prompt_mentions_code=True)
NONE = ContentSignals()

BODIES: list[tuple[str, dict[str, Any], ContentSignals]] = [
    ("empty", {}, NONE),
    ("tools", {"tools": [{"type": "function"}], "messages": [user("hi")]}, TOOLS),
    ("empty-tools", {"tools": [], "messages": [user("hi")]}, NONE),
    ("fence", {"messages": [user("fix this:\n```py\nx = 1\n```")]}, RECENT),
    ("path", {"messages": [user("open src/app/main.rs please")]}, RECENT),
    ("bare-source-file", {"messages": [user("what does setup.py do")]}, RECENT),
    ("prose", {"messages": [user("Write a poem about the sea, 3.5 stanzas.")]}, NONE),
    (
        "content-parts",
        {
            "messages": [
                user([{"type": "text", "text": "see lib/x.py"}, {"type": "image_url"}, "junk"])
            ]
        },
        RECENT,
    ),
    ("tool-result", {"messages": [user("go"), {"role": "tool", "content": "ok"}]}, RECENT),
    (
        "assistant-tool-calls",
        {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
        RECENT,
    ),
    ("old-code-not-recent", {"messages": [user("```x```"), user("a"), user("b"), user("c")]}, NONE),
    ("code-far-from-tail", {"messages": [user("```x``` " + "word " * SCAN_CHARS)]}, NONE),
    (
        "system-about-code",
        {"messages": [{"role": "system", "content": "You are a coding agent."}, user("hello")]},
        SYSTEM,
    ),
    (
        "developer-role",
        {"messages": [{"role": "developer", "content": "Refactor carefully"}, user("hello")]},
        SYSTEM,
    ),
    (
        "system-not-code",
        {"messages": [{"role": "system", "content": "You are a poet."}, user("hello")]},
        NONE,
    ),
    ("null-content", {"messages": [{"role": "assistant", "content": None}]}, NONE),
    ("non-dict-messages", {"messages": ["x", 3, None]}, NONE),
    ("responses-input-string", {"input": "refactor utils/io.py"}, RECENT),
    ("responses-input-list", {"input": [user("```\ncode\n```")]}, RECENT),
    ("responses-instructions", {"input": "hi", "instructions": "You write software."}, SYSTEM),
    ("instructions-not-code", {"input": "hi", "instructions": "Be kind."}, NONE),
    ("completions-prompt", {"prompt": "def f(x):\n```"}, RECENT),
    ("completions-prompt-list", {"prompt": [1, 2, 3]}, NONE),
]


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in BODIES], ids=[i for i, _, _ in BODIES]
)
def test_signals_from_body(body: dict[str, Any], expected: ContentSignals) -> None:
    assert signals_from_body(body) == expected


@pytest.mark.parametrize(
    ("body", "expected"), [(b, e) for _, b, e in BODIES], ids=[i for i, _, _ in BODIES]
)
def test_the_request_path_reads_up_to_the_first_code_signal(
    body: dict[str, Any], expected: ContentSignals
) -> None:
    """`every=False` (the request path): the same class, from the signals read before the
    first that decides it; none it reports is one the full read does not."""
    found = signals_from_body(body, every=False)
    assert classify(found) == classify(expected)
    for name in ("tools_declared", "code_in_recent_messages", "system_prompt_mentions_code"):
        assert not getattr(found, name) or getattr(expected, name)
    if expected.tools_declared:  # an agent's request: no text read at all
        assert found == ContentSignals(tools_declared=True)


def test_a_long_content_list_is_sampled_at_its_ends() -> None:
    # 100,000 parts: the system prompt's first parts and a turn's last parts are read, no more.
    def parts(at: int, text: str) -> list[dict[str, str]]:
        out = [{"type": "text", "text": "plain words"} for _ in range(100_000)]
        out[at] = {"type": "text", "text": text}
        return out

    def signals(system: list[dict[str, str]], turn: list[dict[str, str]]) -> ContentSignals:
        return signals_from_body({"messages": [{"role": "system", "content": system}, user(turn)]})

    assert signals(parts(0, "a coding agent"), parts(-1, "see src/app.py")) == ContentSignals(
        code_in_recent_messages=True, system_prompt_mentions_code=True
    )
    assert signals(parts(SCAN_PARTS, "a coding agent"), parts(-SCAN_PARTS - 1, "see a.py")) == NONE


def test_every_source_extension_is_found_behind_the_prefilter() -> None:
    """The source-file pattern's lookahead on the extensions' first letters turns down prose's
    dots; it must let through every extension the alternation names."""
    from policies.classify import _SOURCE_FILE_RE, _text_has_code

    alternation = re.search(r"\(\?:([a-z|]+)\)", _SOURCE_FILE_RE.pattern)
    assert alternation is not None
    for ext in alternation.group(1).split("|"):
        assert _text_has_code(f"see main.{ext} for it"), ext
        assert not _text_has_code(f"see main. {ext} for it"), ext
