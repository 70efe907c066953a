"""Content classification from cheap signals.

A route that serves both code and prose wants different defaults for each (the facts: 0.7 decodes
code 10-22 % faster than the checkpoint's 1.0 because drafts are accepted more often). Reading the
whole prompt would cost more than the decision itself, so the classifier looks only at signals the
gateway can extract in a few microseconds: whether tools are declared, whether the last few
messages contain code fences or file paths, and whether the system prompt talks about code.

`signals_from_body` extracts those signals from an already-parsed body (no I/O); `classify` maps
them to a class. Both are pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from policies.types import ContentSignals

ContentClass = Literal["code", "prose"]
CONTENT_CLASSES: Final[tuple[ContentClass, ...]] = ("code", "prose")

# How much of the conversation the extractor reads. Agents resend the whole history every turn;
# what the model is about to write is best predicted by the last few turns, and a bounded scan
# keeps the cost flat for 100K-token prompts.
RECENT_MESSAGES: Final = 3
SCAN_CHARS: Final = 8192
# And at most this many parts of a content list, from its start (the system prompt) or its end
# (a recent turn): a list of 100,000 small parts was joined whole before the scan (~20 ms for a
# 7 MB list, the event loop stalled meanwhile); a real turn has a few parts.
SCAN_PARTS: Final = 64

_FENCE: Final = "```"
# A path with a directory and a file extension (src/app.py, ./main.rs, /etc/x.conf), or a bare
# file name with a common source extension. Each pattern starts with a literal ('/' or '.') so
# `re` skips to candidates at C speed, and a lookbehind checks the character before it: an
# unanchored `[\w.-]+/` is retried at every offset (~0.5-1 ms per 8 KB, on every request).
_DIR_FILE_RE: Final = re.compile(r"/(?<=[\w.-]/)[\w-]+\.[A-Za-z0-9]{1,5}\b")
# The lookahead on the extensions' first letters turns down most dots of prose before the
# lookbehind and the alternation are tried (13 -> 3 us on 4 KB of sentences).
_SOURCE_FILE_RE: Final = re.compile(
    r"\.(?=[chgjkprsty])(?<=[\w-]\.)(?:py|rs|go|ts|tsx|js|jsx|java|kt|c|cc|cpp|h|hpp|cs|rb|php|sh|sql|toml|yaml|yml)\b"
)
# Words of a system prompt about code, whole (code, repo) or as prefixes (programm*, debug*).
_WHOLE: Final = (
    "code",
    "coding",
    "software",
    "developer",
    "engineer",
    "repository",
    "repo",
    "compiler",
    "function",
    "terminal",
    "shell",
    "git",
)
_PREFIX: Final = ("programm", "refactor", "debug")


def _is_word(c: str) -> bool:
    return c.isalnum() or c == "_"


def _mentions_code(text: str) -> bool:
    """Whether a word about code occurs (case-insensitive, on word boundaries): `str.find`
    rather than a regex with no literal to skip to (~0.6 ms per 8 KB of prose)."""
    low = text.lower()
    n = len(low)
    for words, whole in ((_WHOLE, True), (_PREFIX, False)):
        for w in words:
            i = low.find(w)
            while i >= 0:
                end = i + len(w)
                if (i == 0 or not _is_word(low[i - 1])) and (
                    not whole or end == n or not _is_word(low[end])
                ):
                    return True
                i = low.find(w, i + 1)
    return False


def classify(signals: ContentSignals) -> ContentClass:
    """The request's content class. Any one code signal is enough: misclassifying code as prose
    costs decode speed on every token, the reverse only a slightly cooler temperature."""
    if (
        signals.tools_declared
        or signals.code_in_recent_messages
        or signals.system_prompt_mentions_code
    ):
        return "code"
    return "prose"


def signals_from_body(body: Mapping[str, Any], *, every: bool = True) -> ContentSignals:
    """Read the classifier's signals from a parsed chat, completions or responses body.

    Unknown shapes give no signal rather than an error: the body is the client's, and the
    backend, not the classifier, is the one to reject it. `every=False` stops at the first code
    signal, cheapest first (the class is then known: `classify`); the signals after it are
    left unread, False. The request path reads that way; explanations read every signal.
    """
    tools = body.get("tools")
    tools_declared = isinstance(tools, list) and len(tools) > 0
    code_recent = False
    system_code = False
    if tools_declared and not every:  # an agent's request: no text read
        return ContentSignals(tools_declared=True)

    messages = body.get("messages")
    if messages is None:
        messages = body.get("input")  # /v1/responses
    instructions = body.get("instructions")  # /v1/responses system prompt
    if isinstance(messages, list):
        system_code = _system_mentions_code(messages)
    if isinstance(instructions, str) and not system_code:
        system_code = _mentions_code(instructions[:SCAN_CHARS])
    if not system_code or every:
        if isinstance(messages, list):
            code_recent = any(_message_has_code(m) for m in messages[-RECENT_MESSAGES:])
        elif isinstance(messages, str):
            code_recent = _text_has_code(messages)
        else:
            prompt = body.get("prompt")  # /v1/completions
            if isinstance(prompt, str):
                code_recent = _text_has_code(prompt)
    return ContentSignals(
        tools_declared=tools_declared,
        code_in_recent_messages=code_recent,
        system_prompt_mentions_code=system_code,
    )


def _system_mentions_code(messages: Sequence[Any]) -> bool:
    for message in messages[:2]:  # the system prompt, when there is one, comes first
        if isinstance(message, Mapping) and message.get("role") in ("system", "developer"):
            if _mentions_code(_text_of(message, head=True)):
                return True
    return False


def _text_of(message: Any, head: bool) -> str:
    """The first (`head`) or last `SCAN_CHARS` of one message's text: a string content, or
    the text parts of a content list joined by newlines, reading at most `SCAN_PARTS` parts."""
    if not isinstance(message, Mapping):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content[:SCAN_CHARS] if head else content[-SCAN_CHARS:]
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    size = 0
    for p in content[:SCAN_PARTS] if head else reversed(content[-SCAN_PARTS:]):
        text = p.get("text") if isinstance(p, Mapping) else None
        if isinstance(text, str):
            texts.append(text)
            size += len(text) + 1
            if size > SCAN_CHARS:
                break
    if head:
        return "\n".join(texts)[:SCAN_CHARS]
    texts.reverse()
    return "\n".join(texts)[-SCAN_CHARS:]


def _message_has_code(message: Any) -> bool:
    # A turn that called tools, or a tool's result, is an agent at work on files.
    if isinstance(message, Mapping) and (
        message.get("tool_calls") or message.get("role") == "tool"
    ):
        return True
    return _text_has_code(_text_of(message, head=False))


def _text_has_code(text: str) -> bool:
    # The tail: in a long message, the code being discussed is usually near the end.
    tail = text[-SCAN_CHARS:]
    return (
        _FENCE in tail
        or _DIR_FILE_RE.search(tail) is not None
        or _SOURCE_FILE_RE.search(tail) is not None
    )
