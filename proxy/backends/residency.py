"""Session-aware admission's state, per engine (backend): which sessions are resident (their
prefixes kept in the engine's KV cache), the tokens they hold, the sessions waiting (in the
order they came, with their clients and how long each waited while present), each keeping its
place across its client's retries for `place_kept_s`, and which client each engine served last.

The rule that reads it is pure (policies/admission.py); the waiting is proxy/relay/hold.py's.
Owned by the event loop; `snapshot` freezes one engine's state for the rule. A change wakes the
engine's waiters (`changed`), which decide again; idleness and `max_wait_s` pass with time, so
waiters also decide again every `RECHECK_S`.

Replicas (`--redis-url`): each publishes its own residency and reads the others'
(proxy/backends/residency_share.py, into `remote`); `snapshot` gives the rule all of them, this
replica's rows winning for a session both name.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from policies.admission import EngineResidency, Resident, Waiter, held_tokens

RECHECK_S: Final = 1.0


@dataclass(slots=True)
class _Resident:
    prefix_tokens: int
    in_flight: int = 0
    idle_since: float | None = None  # monotonic; None while a turn is in flight
    turns: int = 0
    ending: bool = False  # its residency ends when its turn in flight does


@dataclass(slots=True)
class _Place:
    since: float  # monotonic: when the session began waiting
    client: str = ""
    holders: int = 0  # requests of the session waiting in this place now
    left_at: float | None = None  # when the last one left (the place is kept for a retry)
    waited_s: float = 0.0  # while a request of it waited, until `present_since`
    present_since: float | None = None  # None: no request of it waits now


@dataclass(slots=True)
class EngineState:
    residents: dict[str, _Resident] = field(default_factory=dict)
    waiting: OrderedDict[str, _Place] = field(default_factory=OrderedDict)
    shared_tokens: int = 0  # the cached tokens of a session's first turn here
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    served: dict[str, int] = field(default_factory=dict)  # client -> its latest admission's n
    admissions: int = 0
    held: int = 0  # turns held so far (the dashboard; the metrics count them by outcome)
    timeouts: int = 0  # of them, ended without admission
    longest_s: float = 0.0  # the longest wait so far


def _waited(place: _Place, now: float) -> float:
    """The place's wait, counted only while a request of it waited."""
    since = place.present_since
    return place.waited_s + (0.0 if since is None else now - since)


Gauges = Callable[[str, int, int], None]  # (backend, resident sessions, their tokens)
# Another replica's residency on one engine, on this replica's clock: residents, waiting
# sessions (first come first), the shared prefix.
Remote = tuple[tuple[Resident, ...], tuple[Waiter, ...], int]


class Residency:
    def __init__(self, gauges: Gauges | None = None) -> None:
        self._engines: dict[str, EngineState] = {}
        self._gauges = gauges
        self.remote: dict[str, Remote] = {}  # other replicas' residency, by engine
        # (engine, key) -> the session's prefix the engine holds now, from its KV events
        # (None: no events for it); an idle resident counts that instead of its estimate.
        self.measured: Callable[[str, str], int | None] | None = None

    def engine(self, name: str) -> EngineState:
        st = self._engines.get(name)
        if st is None:
            st = self._engines[name] = EngineState()
        return st

    def names(self) -> list[str]:
        return list(self._engines)

    def snapshot(self, name: str, now: float, place_kept_s: float) -> EngineResidency:
        st = self.engine(name)
        gone = [
            k
            for k, p in st.waiting.items()
            if p.holders <= 0 and p.left_at is not None and now - p.left_at > place_kept_s
        ]
        for key in gone:
            del st.waiting[key]
        residents = [
            Resident(k, self.prefix_tokens(name, k, r), r.idle_since)
            for k, r in st.residents.items()
        ]
        waiting = [
            Waiter(k, p.since, p.holders > 0, p.client, _waited(p, now))
            for k, p in st.waiting.items()
        ]
        shared = st.shared_tokens
        remote = self.remote.get(name)
        if remote is not None:  # other replicas': this one's rows win
            ours = set(st.residents) | set(st.waiting)
            residents += [r for r in remote[0] if r.key not in ours]
            waiting += [w for w in remote[1] if w.key not in ours]
            waiting.sort(key=lambda w: w.since)
            shared = max(shared, remote[2])
        return EngineResidency(tuple(residents), tuple(waiting), shared, tuple(st.served.items()))

    def prefix_tokens(self, name: str, key: str, r: _Resident) -> int:
        """An idle resident's measured prefix where the engine's KV events give one; a turn in
        flight counts its estimate (its blocks are being stored: the index lags them)."""
        if r.in_flight or self.measured is None:
            return r.prefix_tokens
        measured = self.measured(name, key)
        return r.prefix_tokens if measured is None else measured

    def local(self, offset: float, limit: int) -> dict[str, dict[str, object]]:
        """This replica's own residency, times on the wall clock (monotonic + `offset`), at
        most `limit` rows each way per engine: what it publishes to the others."""
        out: dict[str, dict[str, object]] = {}
        for name, st in self._engines.items():
            if not st.residents and not st.waiting:
                continue
            out[name] = {
                "residents": [
                    [k, r.prefix_tokens, None if r.idle_since is None else r.idle_since + offset]
                    for k, r in list(st.residents.items())[:limit]
                ],
                "waiting": [
                    [k, p.since + offset, p.holders > 0]
                    for k, p in list(st.waiting.items())[:limit]
                ],
                "shared": st.shared_tokens,
            }
        return out

    def waiting(self, name: str) -> int:
        """Sessions waiting now (places kept for a retry not counted)."""
        return sum(1 for p in self.engine(name).waiting.values() if p.holders > 0)

    # A waiting turn ----------------------------------------------------------------------

    def join(self, name: str, key: str, now: float, client: str = "") -> float:
        """A turn of `key` (a session of `client`) waits: its session's place, kept from an
        earlier request, or a new one at the end. When its session began waiting."""
        st = self.engine(name)
        place = st.waiting.get(key)
        if place is None:
            place = st.waiting[key] = _Place(now, client)
        if place.present_since is None:
            place.present_since = now
        place.holders += 1
        place.left_at = None
        return place.since

    def leave(self, name: str, key: str, now: float, *, keep: bool = True) -> None:
        """A waiting turn left without admission (timed out, client gone): its place is kept
        (unless `keep` is False: a request of no session has no retry to keep it for); its
        wait stops counting until a request of it waits again."""
        st = self.engine(name)
        place = st.waiting.get(key)
        if place is not None:
            place.holders -= 1
            if place.holders <= 0:
                place.left_at = now
                place.waited_s = _waited(place, now)
                place.present_since = None
                if not keep:
                    del st.waiting[key]
            self._changed(name)

    def dequeue(self, name: str, key: str) -> None:
        """`key`'s place, if any, is given up: a request of it went, counted already."""
        if self.engine(name).waiting.pop(key, None) is not None:
            self._changed(name)

    def waited(self, name: str, seconds: float, admitted: bool) -> None:
        """A held turn's wait ended (the dashboard's totals)."""
        st = self.engine(name)
        st.held += 1
        st.timeouts += not admitted
        st.longest_s = max(st.longest_s, seconds)

    # Residency ---------------------------------------------------------------------------

    def admitted(
        self, name: str, key: str, prefix_tokens: int, *, row: str | None = None, client: str = ""
    ) -> None:
        """A turn of `key` (of `client`) goes to the engine: the session is resident there, a
        turn in flight. With `row`, the request is counted under that key for as long as it
        runs only (a request of no session, a compaction or auxiliary one: not its session's
        residency)."""
        st = self.engine(name)
        st.waiting.pop(key, None)
        if client:
            st.admissions += 1
            st.served[client] = st.admissions
        resident = st.residents.get(row or key)
        if resident is None:
            resident = st.residents[row or key] = _Resident(prefix_tokens)
        resident.prefix_tokens = max(resident.prefix_tokens, prefix_tokens)
        resident.in_flight += 1
        resident.idle_since, resident.ending = None, row is not None
        self._changed(name)

    def end(self, name: str, keys: tuple[str, ...] | list[str]) -> None:
        """These sessions' residencies end (idle, yielded, compacted)."""
        st = self.engine(name)
        ended = False
        for key in keys:
            row = st.residents.get(key)
            if row is not None and row.in_flight <= 0:
                del st.residents[key]
                ended = True
            elif row is not None:  # a turn still in flight: it ends when that turn does
                row.ending = True
        if ended:
            self._changed(name)

    def turn_done(
        self,
        name: str,
        key: str,
        now: float,
        *,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        cached_tokens: int | None,
    ) -> None:
        """A turn admitted on `name` ended, however it ended. `cached_tokens`: only for a new
        session's first turn (its hits are the prefix it shares with others), else None."""
        st = self.engine(name)
        row = st.residents.get(key)
        if row is None:
            return
        row.in_flight = max(0, row.in_flight - 1)
        if prompt_tokens:
            row.prefix_tokens = prompt_tokens + (completion_tokens or 0)
            if row.turns == 0 and cached_tokens:  # a new session's hits (the caller's word)
                st.shared_tokens = cached_tokens
        row.turns += 1
        if row.in_flight == 0:
            row.idle_since = now
            if row.ending:
                del st.residents[key]
        self._changed(name)

    def compacted(self, name: str, key: str) -> None:
        """The session compacted: its residency ends once nothing of it is in flight."""
        self.end(name, [key])

    def resident_tokens(self, name: str) -> int:
        st = self.engine(name)
        prefixes = (self.prefix_tokens(name, k, r) for k, r in st.residents.items())
        return held_tokens(prefixes, st.shared_tokens)

    def wake_all(self) -> None:
        """A policy applied: every waiter decides again under it."""
        for name in self._engines:
            self._changed(name)

    def _changed(self, name: str) -> None:
        st = self.engine(name)
        st.changed.set()
        st.changed = asyncio.Event()
        if self._gauges is not None:
            self._gauges(name, len(st.residents), self.resident_tokens(name))
