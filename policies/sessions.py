"""One notion of session: which conversation a request continues, from the request alone. Pure.

In order of trust:
1. The agent's own headers: Claude Code's `x-claude-code-session-id` (+ `x-claude-code-agent-id`
   for a subagent, `x-claude-code-parent-agent-id` naming its parent), Codex's `thread-id`,
   `session_id` / `session-id` (+ `x-codex-parent-thread-id`, `x-openai-subagent`), OpenCode's
   `x-session-id` (+ `x-parent-session-id`).
2. OpenAI's `user` field.
3. A fingerprint of the conversation's stable prefix: the system prompt (chat `system` /
   `developer` messages, Messages' `system`, Responses' `instructions`) and the first user turn.
   Lines that change on every request are skipped: Claude Code's attribution block
   `x-anthropic-billing-header: cc_version=...; cc_entrypoint=...; cch=<hash>;` (system[0] of its
   Messages requests) is left out of the hash, so its turns share one fingerprint.

The key is a hash of (client, source, id, agent): one client cannot name another's session, and
whatever a client sends, the key is 34 characters of [a-z0-9-]. It is what the canary hashes,
what goes upstream as `x-session-id` and what the session table and the request log hold; the
raw id never leaves this module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

Source = Literal["header", "user", "fingerprint"]

# The first header present names the session, and the agent that sent it.
SESSION_HEADERS: Final = (
    (b"x-claude-code-session-id", "claude-code"),
    (b"thread-id", "codex"),
    (b"session_id", "codex"),
    (b"session-id", "codex"),
    (b"x-session-id", "opencode"),
)
AGENT_HEADER: Final = b"x-claude-code-agent-id"  # one session, several agents: each its prefix
PARENT_HEADERS: Final = (
    b"x-claude-code-parent-agent-id",
    b"x-codex-parent-thread-id",
    b"x-parent-session-id",
    b"x-openai-subagent",
)
MAX_ID_BYTES: Final = 256  # a longer id is cut: a key is a hash, the bound is on work done
BILLING_PREFIX: Final = "x-anthropic-billing-header:"
FINGERPRINT_CHARS: Final = 65_536  # at most this much of the prefix is hashed (~70 us warm)
# At most this many content parts are read (system and first user turn together): a real prefix
# has a handful (Claude Code's system blocks, a prompt and a few reminders), and a list of
# 100,000 one-character parts would otherwise be walked to the end on every request (~15 ms for
# a 7 MB list, the event loop stalled meanwhile).
FINGERPRINT_PARTS: Final = 64


@dataclass(frozen=True, slots=True)
class SessionId:
    key: str  # "s-" + 32 hex: scoped by client, safe as a header value and a log field
    source: Source
    agent: str  # a short hash of the agent within the session ("" for the main agent)
    subagent: bool  # a parent header was sent: a subagent's request
    # False for a fingerprint without earlier turns: two conversations may well open with the
    # same prompt, so only a request carrying history continues a fingerprinted session.
    continues: bool = True
    # Which agent program (claude-code, codex, opencode) by its header, else the source (user,
    # fingerprint): `specrouter report --by agent`, the dashboard's per-agent rows.
    kind: str = ""


def session_of(
    client: str, body: Mapping[str, Any], headers: Mapping[bytes, bytes]
) -> SessionId | None:
    """The request's session, or None when nothing identifies one (an embedding, a bare prompt)."""
    subagent = any(h in headers for h in PARENT_HEADERS)
    agent_raw = headers.get(AGENT_HEADER, b"")[:MAX_ID_BYTES]
    for name, kind in SESSION_HEADERS:
        value = headers.get(name)
        if value:
            return _make(client, "header", value[:MAX_ID_BYTES], agent_raw, subagent, kind=kind)
    user = body.get("user")
    if isinstance(user, str) and user:
        return _make(client, "user", user.encode()[:MAX_ID_BYTES], agent_raw, subagent)
    found = fingerprint(body)
    if found is None:
        return None
    return _make(client, "fingerprint", found[0], agent_raw, subagent, found[1])


def _make(
    client: str,
    source: Source,
    ident: bytes,
    agent: bytes,
    subagent: bool,
    continues: bool = True,
    kind: str = "",
) -> SessionId:
    h = hashlib.blake2b(digest_size=16)
    for part in (client.encode(), source.encode(), ident, agent):
        h.update(len(part).to_bytes(4, "big"))  # length-prefixed: no two tuples hash alike
        h.update(part)
    short = hashlib.blake2b(agent, digest_size=4).hexdigest() if agent else ""
    return SessionId("s-" + h.hexdigest(), source, short, subagent, continues, kind or source)


def fingerprint(body: Mapping[str, Any]) -> tuple[bytes, bool] | None:
    """(digest of the system prompt and the first user turn, whether earlier turns are in the
    request), or None without a user turn. Reads at most `FINGERPRINT_CHARS` characters in
    `FINGERPRINT_PARTS` content parts, however long the lists the client sent."""
    walk = _Prefix()
    first_user: Iterable[str] = ()
    history = False
    messages = body.get("messages")
    if isinstance(messages, list):  # chat and Messages
        walk.add(_texts(body.get("system")))
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                continue
            role = m.get("role")
            if role in ("system", "developer"):
                walk.add(_texts(m.get("content")))
            elif role == "user":
                first_user, history = _texts(m.get("content")), len(messages) > i + 1
                break
    else:  # Responses
        walk.add(_texts(body.get("instructions")))
        first_user, history = _first_user_input(body.get("input"))
    walk.add(("\x00",))
    if not walk.add(first_user, sep="\n"):
        return None
    return walk.h.digest(), history


class _Prefix:
    """The stable prefix's digest, fed text by text within the budgets: the digest of the
    texts' first `FINGERPRINT_CHARS` characters, without reading the rest."""

    __slots__ = ("h", "chars", "parts")

    def __init__(self) -> None:
        # BLAKE2b, the key's own hash (`_make`): SHA-256 is hardware-assisted (1.7x faster over
        # a 64 KiB prefix, warm), but OpenSSL's object costs ~20 us more per request once other
        # work has taken the caches, as between a gateway's requests; most prefixes are short.
        self.h = hashlib.blake2b(digest_size=16)
        self.chars = FINGERPRINT_CHARS
        self.parts = FINGERPRINT_PARTS

    def add(self, texts: Iterable[str], sep: str = "") -> bool:
        """Hash `texts` joined by `sep`; whether the joined text is non-empty (a user turn
        without text is no user turn)."""
        found = False
        for n, text in enumerate(texts):
            if n:
                self._hash(sep)
            found = found or bool(text) or (n > 0 and bool(sep))
            self._hash(text)
            self.parts -= 1
            if self.parts <= 0 or (self.chars <= 0 and found):
                break
        return found

    def _hash(self, text: str) -> None:
        if self.chars > 0:
            piece = text[: self.chars]
            self.chars -= len(piece)
            self.h.update(piece.encode("utf-8", "surrogatepass"))


def _first_user_input(value: Any) -> tuple[Iterable[str], bool]:
    if isinstance(value, str):
        return (value,), False
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, dict) and item.get("role") == "user":
                return _texts(item.get("content")), len(value) > i + 1
    return (), False


def _texts(content: Any) -> Iterator[str]:
    """The texts of a message content (a string or a list of parts), billing lines dropped,
    read lazily: the caller stops at its budget."""
    if isinstance(content, str):
        yield _strip_billing(content)
    elif isinstance(content, list):
        for p in content:
            if isinstance(p, dict) and isinstance(p.get("text"), str):
                yield _strip_billing(p["text"])


def _strip_billing(text: str) -> str:
    if BILLING_PREFIX not in text:  # the common case: one scan, no copy
        return text
    return "\n".join(_kept(text.split("\n")))


def _kept(lines: Iterable[str]) -> Iterable[str]:
    return (line for line in lines if not line.lstrip().startswith(BILLING_PREFIX))
