"""The session table: session key -> the engine holding its prefix, last seen, tokens held.

Local and bounded (the policy's `sessions.table_size`): past it, the least recently seen row of
the client holding the most rows goes, so one client's many sessions (12,000 ids, say) evict
its own rows, never another client's live ones (a row merged from another replica keeps its
client when the policy has it, else counts as client ""). Owned by the event loop: a lookup is one dict get. Per replica: with `--redis-url` the sharing task
(proxy/backends/session_share.py) hears of each local change through `on_change` and `merge`s
other replicas' newer rows; the request path never waits on it.

A request reads its session's row when it is decided (`view`), places a new or moved session
on its engine then (`placed`, so a second request of the session arriving meanwhile follows it),
and adds what its turn cost when it ends (`finished`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from policies.sessions import SessionId
from policies.types import SessionView
from proxy.backends.attained import AttainedWindow

MIN_SESSIONS_FOR_MEAN = 20  # fewer sessions seen: the policy's default_turns


@dataclass(slots=True)
class SessionEntry:
    engine: str
    last_seen: float  # monotonic
    client: str = ""
    agent: str = ""
    source: str = ""
    subagent: bool = False
    prefix_tokens: int = 0
    turns: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cached_tokens: int = 0
    decode_s: float = 0.0
    moves: int = 0
    # Prefix tokens its turns found uncached of what the engine held (proxy/backends/prefix.py),
    # and the last loss's cause and where ("" when none yet).
    lost_tokens: int = 0
    loss_cause: str = ""
    loss_where: str = ""
    # Tokens served for it, by minute (proxy/backends/attained.py): its fairness level.
    attained: AttainedWindow = field(default_factory=AttainedWindow)


@dataclass(frozen=True, slots=True)
class SharedRow:
    """What replicas share of a row: enough for another replica's stickiness arithmetic."""

    engine: str
    last_seen: float  # monotonic, on the receiving replica's clock
    prefix_tokens: int
    turns: int
    tokens_out: int
    attained: tuple[tuple[float, int], ...] = ()  # (bucket start, tokens), this clock
    client: str = ""  # whose session: what eviction weighs it by


class SessionTable:
    def __init__(self, size: int = 10_000, idle_s: float = 1800.0) -> None:
        self.size, self.idle_s = size, idle_s
        self.window_s = 600.0  # the policy's fairness window: `view`'s attained_tokens
        self._rows: OrderedDict[str, SessionEntry] = OrderedDict()
        # The same keys by client, least recently seen first: what eviction takes from.
        self._by_client: dict[str, OrderedDict[str, None]] = {}
        self._turns = 0  # over the rows: the mean turns per session is _turns / len
        # A local change to a row (not a merge): the sharing task queues the key.
        self.on_change: Callable[[str], None] | None = None
        # (engine, key) -> the prefix the engine holds now, from its KV events (None: no
        # events for it): what `view` gives in place of the estimate (prompt + output).
        self.measured: Callable[[str, str], int | None] | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def get(self, key: str) -> SessionEntry | None:
        return self._rows.get(key)

    def configure(self, size: int, idle_s: float, window_s: float | None = None) -> None:
        """The policy's bounds (`sessions.table_size`, `idle_s`) and fairness window, checked
        per request: a policy applied meanwhile takes effect on the next one."""
        self.size, self.idle_s = size, idle_s
        if window_s is not None:
            self.window_s = window_s

    def view(self, sid: SessionId, now: float) -> SessionView:
        row = self._rows.get(sid.key)
        if row is None or not sid.continues or now - row.last_seen > self.idle_s:
            return SessionView(sid.key, sid.subagent, mean_turns=self.mean_turns())
        turns = row.turns
        return SessionView(
            sid.key,
            sid.subagent,
            row.engine,
            self.prefix_tokens(sid.key, row),
            turns,
            row.tokens_out / turns if turns else 0.0,
            self.mean_turns(),
            row.attained.total(now, self.window_s),
        )

    def prefix_tokens(self, key: str, row: SessionEntry) -> int:
        """What the row's engine holds of the session: measured where the engine's KV events
        say, else the estimate (its last turn's prompt and output)."""
        measured = None if self.measured is None else self.measured(row.engine, key)
        return row.prefix_tokens if measured is None else measured

    def mean_turns(self) -> float | None:
        n = len(self._rows)
        return self._turns / n if n >= MIN_SESSIONS_FOR_MEAN else None

    def placed(self, sid: SessionId, client: str, engine: str, now: float) -> None:
        row = self._rows.get(sid.key)
        if row is None:
            row = self._rows[sid.key] = SessionEntry(
                engine, now, client, sid.agent, sid.source, sid.subagent
            )
            self._by_client.setdefault(client, OrderedDict())[sid.key] = None
            self._evict()
        elif row.engine != engine:
            row.engine, row.prefix_tokens = engine, 0  # the new engine holds none of it
            row.moves += 1
        row.last_seen = now
        self._touch(sid.key, row)
        if self.on_change is not None:
            self.on_change(sid.key)

    def finished(
        self,
        key: str,
        engine: str,
        now: float,
        *,
        prompt_tokens: int | None,
        completion_tokens: int,
        cached_tokens: int | None,
        decode_s: float,
    ) -> None:
        """One turn ended on `engine` (a retry may have served it elsewhere than placed)."""
        row = self._rows.get(key)
        if row is None:
            return
        if engine and row.engine != engine:
            row.engine = engine
            row.moves += 1
        row.turns += 1
        self._turns += 1
        row.tokens_in += prompt_tokens or 0
        row.tokens_out += completion_tokens
        row.cached_tokens += cached_tokens or 0
        row.decode_s += decode_s
        if prompt_tokens:  # what the engine's prefix cache now holds of this conversation
            row.prefix_tokens = prompt_tokens + completion_tokens
        row.last_seen = now
        if self.on_change is not None:
            self.on_change(key)

    def lost(self, key: str, tokens: int, cause: str, where: str) -> None:
        """A turn of the session found `tokens` of its prefix uncached, for `cause`."""
        row = self._rows.get(key)
        if row is not None and tokens > 0:
            row.lost_tokens += tokens
            row.loss_cause, row.loss_where = cause, where

    def served(self, key: str, tokens: int, now: float) -> None:
        """A request of the session ended: `tokens` served for it (its turns, and the
        compaction and auxiliary requests that are not), counted in its attained service."""
        row = self._rows.get(key)
        if row is None or tokens <= 0:
            return
        row.attained.add(tokens, now)
        row.last_seen = max(row.last_seen, now)  # so other replicas take the change
        if self.on_change is not None:
            self.on_change(key)

    def merge(self, key: str, shared: SharedRow) -> bool:
        """A row from another replica: taken when it was seen later than ours (last seen wins).
        True when taken."""
        row = self._rows.get(key)
        if row is not None and row.last_seen >= shared.last_seen:
            return False
        if row is None:
            row = self._rows[key] = SessionEntry(shared.engine, shared.last_seen, shared.client)
            self._by_client.setdefault(row.client, OrderedDict())[key] = None
        elif row.engine != shared.engine:
            row.moves += 1
        self._turns += shared.turns - row.turns
        row.engine, row.last_seen = shared.engine, shared.last_seen
        row.prefix_tokens, row.turns, row.tokens_out = (
            shared.prefix_tokens,
            shared.turns,
            shared.tokens_out,
        )
        row.attained = AttainedWindow(shared.attained)
        self._touch(key, row)
        self._evict()
        return True

    def recent(self, limit: int) -> Iterator[tuple[str, SessionEntry]]:
        """The most recently seen rows first."""
        for i, key in enumerate(reversed(self._rows)):
            if i >= limit:
                return
            yield key, self._rows[key]

    def _touch(self, key: str, row: SessionEntry) -> None:
        self._rows.move_to_end(key)
        mine = self._by_client.get(row.client)
        if mine is not None and key in mine:
            mine.move_to_end(key)

    def _evict(self) -> None:
        while len(self._rows) > self.size:
            # The client holding the most rows (clients are few: the policy's, plus "").
            client, mine = max(self._by_client.items(), key=lambda kv: len(kv[1]))
            key, _ = mine.popitem(last=False)
            if not mine:
                del self._by_client[client]
            dropped = self._rows.pop(key)
            self._turns -= dropped.turns
