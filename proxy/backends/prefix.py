"""Per-turn prefix accounting: what a session's turn should have found in its engine's prefix
cache, what it lost, and why, from what the gateway already has.

At decision, the request's conversation is taken, with its session's previous turn's; the two
are compared byte for byte when the turn ends (off the way to the engine), on the JSON
`check_fields` already wrote for the upstream body (proxy/relay/fields.py): no walk of the
parsed conversation. The fields an engine renders first (`tools`, `system`, `instructions`)
are compared whole, then the list (`messages`, `input`): the body *extends* the previous one
when the previous list, without its closing `]`, starts the new one (one memcmp; 10-13 us a
406 KiB body at the median, loadtests/bench/prefix_check.py, docs/sessions.md). Only when it
does not is the first changed byte located (chunks, then a bisection), keys the engine does not
render skipped, and named by parsing the list again and encoding its items from its nearer end
up to it.

When the turn ends (`Baselines.finished`), with the engine's usage:

    held     = whole blocks of min(previous prompt, this prompt - 1), on the same engine, else 0
    expected = held when the body extends the previous one, else the share of `held` before the
               first change (by bytes: an estimate), in whole blocks
    lost     = held - cached, when positive

The previous turn's output is not counted: the chat template renders an answer back differently
from how it was generated (reasoning dropped, end-of-turn tokens), so counting it would show a
loss on every turn. The cause of a loss: `compacted` (the session compacted since: the agent's
headers), `client-rewrite` (the body changed before its end; `where` names the field or item),
else the engine's side, told apart by its KV events where the gateway reads them with the
session's tag (kv_index.py): `engine-reset`, `evicted`, `engine-rendering`; else `unknown`.

The previous turn's bytes are kept per session (no copy: the bytes the upstream body was
written from), least recently used first out past `BASELINE_BYTES`; a session without them
(dropped, another replica's, its first turn) has nothing expected.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from proxy.backends.kv_index import Residency

# What the kept conversations may hold: 40 agent bodies of 400 KiB, 2.5 times the sixteen
# sessions one GB10 holds in its KV cache; within an idle gateway's memory (body_budget.py's
# IDLE_MIB: 130 MB measured of 160 MiB), so the body budget keeps its share of the 512 MiB.
BASELINE_BYTES: Final = 16 * 2**20
DEFAULT_BLOCK: Final = 16  # vLLM's default KV block size; a backend's reported one wins
_CHUNK: Final = 4096
# Keys an engine does not render (vLLM ignores Anthropic's cache breakpoints): a key after
# another (its comma before it), or the first of its object (its comma after it).
_UNRENDERED: Final = ((b',"cache_control":{', False), (b'"cache_control":{', True))

# Per endpoint: the fields the engine renders before the conversation, and the conversation.
_LEAD: Final[dict[str, tuple[str, ...]]] = {
    "chat": ("tools",),
    "messages": ("system", "tools"),
    "responses": ("instructions", "tools"),
}
_LIST: Final = {"chat": "messages", "messages": "messages", "responses": "input"}

Encoded = dict[str, tuple[Any, memoryview]]


@dataclass(frozen=True, slots=True)
class Conversation:
    """One request's conversation as bytes: its lead fields, then its list's JSON."""

    endpoint: str  # the API it came on: each renders its own prompt, with its own lead fields
    lead: tuple[bytes | memoryview | str | None, ...]
    items: memoryview

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.lead if v is not None) + len(self.items)

    def held_bytes(self) -> int:
        """What keeping it holds alive (the whole encoded buffers its views are of)."""
        return sum(
            len(v.obj) if isinstance(v, memoryview) and isinstance(v.obj, bytes) else len(v)
            for v in (*self.lead, self.items)
            if v is not None
        )


class Check:
    """A turn and its session's previous one, taken at decision (what the previous turn's engine
    holds of the session is read then, before this turn's own blocks change it); the two are
    compared when first asked (`extends`, `where`, `share`): at the turn's end, after the
    engine was asked, not on the way to it."""

    __slots__ = ("now", "prev", "prev_prompt", "prev_engine", "resident", "_compared")

    def __init__(
        self,
        now: Conversation,
        prev: Conversation | None = None,
        prev_prompt: int = 0,  # the previous turn's prompt tokens (0: nothing to compare with)
        prev_engine: str = "",
        resident: Residency | None = None,
        *,
        compared: tuple[bool, str, float] | None = None,  # (extends, where, share) when known
    ) -> None:
        self.now = now
        # held until this turn ends, whatever the budget drops meanwhile: at most one
        # conversation more per request in flight
        self.prev = prev
        self.prev_prompt = prev_prompt
        self.prev_engine = prev_engine
        # What the previous turn's engine holds of the session, from its KV events
        # (kv_index.py); None: no events from that engine, or none tagged with the session.
        self.resident = resident
        self._compared = compared

    @property
    def extends(self) -> bool:
        return self._compare()[0]

    @property
    def where(self) -> str:
        """The first changed field or item ("" when it extends)."""
        return self._compare()[1]

    @property
    def share(self) -> float:
        """Of the previous conversation's bytes, before the first change."""
        return self._compare()[2]

    def _compare(self) -> tuple[bool, str, float]:
        if self._compared is None:
            prev = self.prev
            self._compared = (False, "", 0.0) if prev is None else compare(prev, self.now)
        return self._compared


@dataclass(frozen=True, slots=True)
class PrefixLoss:
    expected: int
    lost: int
    cause: str  # "" when nothing was lost; compacted | client-rewrite | unknown
    where: str = ""


NOTHING: Final = PrefixLoss(0, 0, "")


def conversation_of(endpoint: str, body: dict[str, Any], encoded: Encoded) -> Conversation | None:
    """The request's conversation, when it has one the check can compare."""
    name = _LIST.get(endpoint)
    if name is None or name not in encoded or body.get("previous_response_id"):
        return None  # a chained Responses turn carries only its new items: nothing to compare
    lead: list[bytes | memoryview | str | None] = []
    for field in _LEAD[endpoint]:
        value = body.get(field)
        if field in encoded:
            lead.append(encoded[field][1])
        else:
            lead.append(value if isinstance(value, str) else None)
    return Conversation(endpoint, tuple(lead), encoded[name][1])


def compare(prev: Conversation, now: Conversation) -> tuple[bool, str, float]:
    """(extends, where, share of the previous bytes before the first change). A changed list is
    parsed again (its tree was freed once decided) and encoded up to the change to name it."""
    endpoint = now.endpoint
    before = 0
    for field, a, b in zip(_LEAD[endpoint], prev.lead, now.lead, strict=True):
        x, y = _bytes(a), _bytes(b)
        i, j = _diverge(x, y, _end(x))
        if i < _end(x) or j < _end(y):
            return False, field, (before + i - x[1]) / max(1, prev.size)
        before += _end(x) - x[1]
    x, y = _bytes(prev.items), _bytes(now.items)
    i, j = _diverge(x, y, _end(x) - 1)  # the previous list without its `]`
    if i == _end(x) - 1:
        return True, "", 1.0
    items = orjson.loads(memoryview(y[0])[y[1] : _end(y)])
    where = f"{_LIST[endpoint]}[{_item_at(items, j - y[1], _end(y) - y[1])}]"
    return False, where, (before + i - x[1]) / max(1, prev.size)


def account(
    check: Check,
    engine: str,
    prompt: int | None,
    cached: int | None,
    *,
    block: int,
    compacted: bool,
) -> PrefixLoss:
    """The turn's loss once its usage is known (pure)."""
    if not check.prev_prompt or prompt is None or cached is None or engine != check.prev_engine:
        return NOTHING
    held = min(check.prev_prompt, prompt - 1) // block * block
    expected = held if check.extends else int(held * check.share) // block * block
    lost = max(0, held - cached)
    if not lost:
        return PrefixLoss(expected, 0, "")
    if compacted:
        return PrefixLoss(expected, lost, "compacted", check.where)
    if not check.extends:
        return PrefixLoss(expected, lost, "client-rewrite", check.where)
    return PrefixLoss(expected, lost, _engine_side(check.resident, held))


def _engine_side(resident: Residency | None, held: int) -> str:
    """The engine's side of a loss, from its KV events: a reset since the session's last turn,
    its blocks gone before this turn (`evicted`), or still there but not served (the engine
    rendered the conversation otherwise: `engine-rendering`); `unknown` without events that
    cover what the previous turn left."""
    if resident is None or not resident.block_size:
        return "unknown"
    if resident.resets:
        return "engine-reset"
    if resident.chain * resident.block_size < held:
        return "unknown"  # the events seen do not cover the previous prompt
    return "evicted" if resident.tokens < held else "engine-rendering"


@dataclass(slots=True)
class _Baseline:
    conversation: Conversation
    prompt: int
    engine: str
    compacted: bool = False  # the session compacted since this turn


class Baselines:
    """Each session's previous turn, kept for its next one; bounded by bytes held."""

    def __init__(
        self,
        budget: int = BASELINE_BYTES,
        residency: Callable[[str, str], Residency | None] | None = None,
    ) -> None:
        self.budget = budget
        self.residency = residency  # (engine, session): what the engine's KV events say
        self.held = 0
        self._rows: OrderedDict[str, _Baseline] = OrderedDict()

    def __len__(self) -> int:
        return len(self._rows)

    def check(
        self, key: str, endpoint: str, body: dict[str, Any], encoded: Encoded
    ) -> Check | None:
        """At decision, before the body's containers are released."""
        now = conversation_of(endpoint, body, encoded)
        if now is None:
            return None
        row = self._rows.get(key)
        if row is None or row.conversation.endpoint != endpoint:
            # a session's turn on another API (an SDK's chat, then its Messages) renders
            # another prompt: nothing to compare it with
            return Check(now)
        # read now, before this turn's own blocks change it
        resident = None if self.residency is None else self.residency(row.engine, key)
        return Check(now, row.conversation, row.prompt, row.engine, resident)

    def compacted(self, key: str) -> None:
        """A compaction request of the session ended: its next turn starts a new prefix."""
        row = self._rows.get(key)
        if row is not None:
            row.compacted = True

    def finished(
        self,
        key: str,
        check: Check,
        engine: str,
        prompt: int | None,
        cached: int | None,
        *,
        block: int = DEFAULT_BLOCK,
        compacted: bool = False,
    ) -> PrefixLoss:
        """A turn of the session ended `ok`: its loss, and it becomes the session's baseline."""
        row = self._rows.pop(key, None)
        if row is not None:
            self.held -= row.conversation.held_bytes()
            compacted = compacted or row.compacted
        loss = account(check, engine, prompt, cached, block=block, compacted=compacted)
        if prompt:
            kept = _Baseline(check.now, prompt, engine)
            self._rows[key] = kept
            self.held += kept.conversation.held_bytes()
            while self.held > self.budget and self._rows:
                _, old = self._rows.popitem(last=False)
                self.held -= old.conversation.held_bytes()
        return loss


Span = tuple[bytes, int]  # a field's JSON: the buffer it is in, and its margin each side


def _bytes(value: bytes | memoryview | str | None) -> Span:
    """A field's JSON without a copy (check_fields' views are centred in their buffer: the same
    wrap of brackets each side)."""
    if value is None:
        return b"", 0
    if isinstance(value, str):
        return value.encode(), 0
    if isinstance(value, memoryview) and isinstance(value.obj, bytes):
        return value.obj, (len(value.obj) - len(value)) // 2
    return bytes(value), 0


def _end(span: Span) -> int:
    return len(span[0]) - span[1]


def _diverge(x: Span, y: Span, x_end: int) -> tuple[int, int]:
    """Where x's bytes up to `x_end` and y's first differ, as (offset in x, offset in y), both
    in their buffers; (x_end, ...) when x's are a start of y's. A span the engine does not
    render (`cache_control`, which Claude Code moves to the newest message each turn) is skipped
    on either side. Compared with memcmp on the buffers: no copy (== on memoryviews goes
    element by element, 70x slower)."""
    (xb, i), (yb, j) = x, y
    y_end = _end(y)
    xv = memoryview(xb)
    while True:
        if y_end - j >= x_end - i and yb.startswith(xv[i:x_end], j):
            return x_end, j + x_end - i
        while i + _CHUNK <= x_end and j + _CHUNK <= y_end and yb.startswith(xv[i : i + _CHUNK], j):
            i, j = i + _CHUNK, j + _CHUNK
        lo, hi = 0, min(x_end - i, y_end - j, _CHUNK)  # the first lo bytes agree
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if yb.startswith(xv[i : i + mid], j) else (lo, mid - 1)
        i, j = i + lo, j + lo
        if i >= x_end or j >= y_end:
            return i, j
        si, sj = _skip(xb, i, x_end), _skip(yb, j, y_end)
        if si == i and sj == j:
            return i, j
        i, j = si, sj


def _skip(b: bytes, i: int, end: int) -> int:
    """Past an unrendered key and its object value starting at `i` (with one comma), else `i`.
    In JSON a raw `"cache_control":{` can only be a key: inside a string its quotes are escaped."""
    for mark, comma_after in _UNRENDERED:
        if b.startswith(mark, i, end):
            close = b.find(b"}", i + len(mark), end)
            if close < 0:
                return i
            j = close + 1
            return j + 1 if comma_after and b.startswith(b",", j, end) else j
    return i


def _item_at(items: Any, offset: int, size: int) -> int:
    """The index of the list item holding byte `offset` of the list's JSON (`size` bytes; a
    change at the comma after an item is the next one's, past the last item the first new one).
    Each item is encoded from the nearer end of the list only: a change near the end (a
    context edit) costs the items after it, not the conversation."""
    if not isinstance(items, list):
        return 0
    if offset >= size // 2:
        end = size - 1  # at `]`
        for i in range(len(items) - 1, -1, -1):
            start = end - len(orjson.dumps(items[i]))
            if offset >= start:
                return i if offset < end else i + 1
            end = start - 1  # the comma before it
        return 0
    pos = 1  # past `[`
    for i, item in enumerate(items):
        pos += len(orjson.dumps(item))
        if offset < pos:
            return i
        pos += 1
    return len(items)
