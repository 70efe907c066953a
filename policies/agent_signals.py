"""What an agent says about its own request, read from its headers, bounded. Pure.

- Claude Code (2.1.273+, with `CLAUDE_CODE_GATEWAY_HINT_HEADERS=1`):
  `x-claude-code-request-class` (main / subagent / workflow / compaction / auxiliary),
  `x-claude-code-agent-type`, `x-claude-code-compaction`, `x-claude-code-context-compacted`,
  `x-claude-code-prev-tool-durations` and (2.1.283+) `x-claude-code-prompt-id`.
- Codex: `x-openai-subagent` (review, compact, collab_spawn, or a label) and
  `x-codex-turn-metadata` (a JSON object: its `turn_id`, hashed, and its `request_kind`, `turn`
  read as main, a compaction as compaction, any other as other; nothing else of it is kept).

Header values are client input. What is kept is bounded whatever was sent: the class is one of
`REQUEST_CLASSES` (an unknown value is `other`), short names are cut to `MAX_NAME_CHARS` of
[a-z0-9_.:-], ids are hashed with the client's name (one client cannot name another's prompt or
turn), durations are at most `MAX_DURATIONS` numbers. Nothing else of a header is kept.

A class records and keeps a request in place: a compaction or auxiliary request is served
where its session is and never moves it (policies/engine.py, `keeps_place`). It grants no pin
and no other engine; with the policy's `fairness` on, compaction, auxiliary and subagent
requests get their class's level of vLLM priority (policies/fairness.py: by default never ahead
of a fresh session's, a subagent never ahead of its own attained level).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import orjson

REQUEST_CLASSES: Final = ("main", "subagent", "workflow", "compaction", "auxiliary", "other")
KEEPS_PLACE: Final = frozenset({"compaction", "auxiliary"})
# Codex's `x-openai-subagent` values (its SubAgentSource); any other label is `other`.
CODEX_SUBAGENTS: Final = frozenset({"review", "compact", "collab_spawn"})

CLASS_HEADER: Final = b"x-claude-code-request-class"
AGENT_TYPE_HEADER: Final = b"x-claude-code-agent-type"
COMPACTION_HEADER: Final = b"x-claude-code-compaction"
COMPACTED_HEADER: Final = b"x-claude-code-context-compacted"
TOOL_DURATIONS_HEADER: Final = b"x-claude-code-prev-tool-durations"
PROMPT_ID_HEADER: Final = b"x-claude-code-prompt-id"
CODEX_SUBAGENT_HEADER: Final = b"x-openai-subagent"
CODEX_TURN_METADATA_HEADER: Final = b"x-codex-turn-metadata"

MAX_NAME_CHARS: Final = 32  # an agent type, a subagent label, a compaction trigger
MAX_ID_BYTES: Final = 256  # an id is hashed: the bound is on the work done
MAX_METADATA_BYTES: Final = 4096  # a longer turn-metadata header is not parsed at all
MAX_DURATIONS: Final = 16  # numbers kept of the previous tools' durations
MAX_DURATION_S: Final = 86_400.0  # one number, whatever its unit, is capped at this
_NAME: Final = re.compile(rb"[^a-z0-9_.:-]")
_NUMBER: Final = re.compile(rb"\d{1,9}(?:\.\d{1,6})?")
_TRUE: Final = frozenset({b"1", b"true", b"yes", b"on"})
_HEADERS: Final = (
    CLASS_HEADER,
    AGENT_TYPE_HEADER,
    COMPACTION_HEADER,
    COMPACTED_HEADER,
    TOOL_DURATIONS_HEADER,
    PROMPT_ID_HEADER,
    CODEX_SUBAGENT_HEADER,
    CODEX_TURN_METADATA_HEADER,
)


@dataclass(frozen=True, slots=True)
class AgentSignals:
    """A request's own signals; "" / None where the agent sent nothing."""

    request_class: str = ""  # one of REQUEST_CLASSES, "" when not declared
    agent_type: str = ""  # Claude Code's agent type, or Codex's subagent label
    compaction: str = ""  # Claude Code's compaction header (its trigger), a short name
    context_compacted: bool | None = None
    prev_tool_durations: tuple[float, ...] = ()
    prompt_id: str = ""  # "p-" + 16 hex: the prompt id hashed with the client
    turn_id: str = ""  # "t-" + 16 hex: Codex's turn id hashed with the client

    @property
    def keeps_place(self) -> bool:
        """Served where its session is, never moving it, not counted as its turn."""
        return self.request_class in KEEPS_PLACE

    @property
    def durations_text(self) -> str:
        """The durations as stored: at most `MAX_DURATIONS` numbers, comma-separated."""
        return ",".join(f"{d:g}" for d in self.prev_tool_durations)


NONE: Final = AgentSignals()


def signals_of(client: str, headers: Mapping[bytes, bytes]) -> AgentSignals:
    """The request's signals, every value bounded (see the module docstring)."""
    if not _any_present(headers):  # most requests: no agent signal at all
        return NONE
    cls = _class(headers.get(CLASS_HEADER))
    compaction = _name(headers.get(COMPACTION_HEADER))
    agent_type = _name(headers.get(AGENT_TYPE_HEADER))
    codex = headers.get(CODEX_SUBAGENT_HEADER)
    if codex is not None:
        label = _name(codex)
        label = label if label in CODEX_SUBAGENTS else ("other" if label else "")
        agent_type = agent_type or label
        if not cls and label:
            cls = "compaction" if label == "compact" else "subagent"
    if not cls and compaction and compaction not in ("0", "false", "no", "off"):
        cls = "compaction"
    turn, kind = _codex_turn(headers.get(CODEX_TURN_METADATA_HEADER))
    cls = cls or _codex_class(kind)
    compacted = headers.get(COMPACTED_HEADER)
    return AgentSignals(
        request_class=cls,
        agent_type=agent_type,
        compaction=compaction,
        context_compacted=None if compacted is None else compacted.strip().lower() in _TRUE,
        prev_tool_durations=_durations(headers.get(TOOL_DURATIONS_HEADER)),
        prompt_id=_hashed("p-", client, headers.get(PROMPT_ID_HEADER)),
        turn_id=_hashed("t-", client, turn),
    )


def _any_present(headers: Mapping[bytes, bytes]) -> bool:
    return any(h in headers for h in _HEADERS)


def _class(value: bytes | None) -> str:
    if value is None:
        return ""
    name = value[:MAX_NAME_CHARS].strip().lower().decode("latin-1")
    if not name:
        return ""
    return name if name in REQUEST_CLASSES else "other"


def _name(value: bytes | None) -> str:
    """A short name: lower case, [a-z0-9_.:-] only, at most `MAX_NAME_CHARS`."""
    if not value:
        return ""
    return _NAME.sub(b"", value[: MAX_NAME_CHARS * 4].strip().lower())[:MAX_NAME_CHARS].decode()


def _durations(value: bytes | None) -> tuple[float, ...]:
    if not value:
        return ()
    out: list[float] = []
    for match in _NUMBER.finditer(value[: MAX_DURATIONS * 24]):
        out.append(min(float(match.group()), MAX_DURATION_S))
        if len(out) >= MAX_DURATIONS:
            break
    return tuple(out)


def _hashed(prefix: str, client: str, value: bytes | None) -> str:
    if not value:
        return ""
    h = hashlib.blake2b(digest_size=8)
    for part in (client.encode(), value[:MAX_ID_BYTES]):
        h.update(len(part).to_bytes(4, "big"))
        h.update(part)
    return prefix + h.hexdigest()


def _codex_turn(value: bytes | None) -> tuple[bytes | None, str]:
    """(`turn_id`, `request_kind` as a short name) of Codex's turn metadata (a JSON object):
    (None, "") when longer than `MAX_METADATA_BYTES` or not JSON."""
    if not value or len(value) > MAX_METADATA_BYTES:
        return None, ""
    try:
        meta = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None, ""
    if not isinstance(meta, dict):
        return None, ""
    turn, kind = meta.get("turn_id"), meta.get("request_kind")
    kind = _name(kind.encode("utf-8", "surrogatepass")) if isinstance(kind, str) else ""
    if isinstance(turn, str) and turn:
        return turn.encode("utf-8", "surrogatepass"), kind
    return None, kind


def _codex_class(kind: str) -> str:
    """Codex's `request_kind` as a class: `turn` is main, a compaction is one, else other."""
    if not kind:
        return ""
    if kind == "turn":
        return "main"
    return "compaction" if "compact" in kind else "other"
