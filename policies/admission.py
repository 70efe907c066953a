"""Session-aware admission: whether a session's turn goes to its engine now or waits. Pure.

An engine's KV cache keeps the prefixes of the sessions it serves between their turns while
they fit; once they do not, vLLM evicts the least recently used blocks and every session
re-prefills its whole conversation at each turn (measured: 16 agents on one GB10 did half the
work of 8). The gateway knows the sessions and their prefixes, so it keeps a set of *resident*
sessions per engine that fits, and lets the others wait:

    held   = shared + sum(max(0, prefix - shared))   over the resident sessions (the shared
             system-prompt prefix counted once)
    fits   = held (with the turn's session added) + max_num_seqs x turn_tokens
             <= fit_fraction x the engine's KV tokens

- A turn of a resident session goes (`resident`), unless another session has waited
  `max_wait_s`: then this turn boundary ends its residency (`yield`) and it waits in turn.
- A turn of another session goes when it fits and no session waits before it (`fits`); when
  nothing is resident it goes whatever its size (`alone`: it cannot do better by waiting);
  otherwise it waits (`full`, `queue`), its place kept across the client's retries (the state,
  proxy/backends/residency.py); a place kept for a retry blocks nobody until the retry comes,
  and its wait counts only while a request of it waits (`waited_s`): an absent place banks
  nothing toward a yield.
- The queue is shared out per client: round by round, each client's longest-waiting session
  (the client served least recently on the engine first), then each one's next (a client's six
  sessions once kept another's one turn waiting 80 s).
- Residency ends after `idle_s` without a turn, at a compaction, or at a yield (`ends`).
- A compaction or auxiliary request (a class the client declares) goes at once only when its
  session is resident (`class`: it reads the prefix the engine holds); otherwise it is a turn
  like any other (six "compactions" of new sessions once went through a full engine while
  another client's turn waited 21 s). Requests of no session and such requests are counted
  while they run (the caller's, proxy/relay/hold.py).
- Never held: admission off (`off`), an engine whose KV tokens are unknown (`kv-unknown`), an
  embedding (the caller's).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from policies.spec.admission import SessionAdmissionSpec
from policies.spec.backends import BackendSpec
from policies.stickiness import MoveCost, move_cost
from policies.types import SessionView

# Every verdict's reason: a closed set (a metric label).
ADMIT_REASONS: Final = ("off", "class", "kv-unknown", "resident", "fits", "alone")
WAIT_REASONS: Final = ("full", "queue", "yield")
# A prompt's tokens estimated from its body's size, before the engine has counted them (a
# session's first turn on an engine): JSON text runs about 4 bytes a token.
BYTES_PER_TOKEN: Final = 4


@dataclass(frozen=True, slots=True)
class Resident:
    key: str
    prefix_tokens: int  # what the engine holds of its conversation
    idle_since: float | None = None  # None: a turn in flight; else when its last turn ended


@dataclass(frozen=True, slots=True)
class Waiter:
    key: str
    since: float  # when it began waiting; a retry keeps it
    # A request of it waits now. A place whose request left (timed out, client gone) is kept
    # for the client's retry but blocks nobody meanwhile.
    present: bool = True
    client: str = ""  # whose session ("": unknown, a client of its own)
    waited_s: float | None = None  # seconds a request of it waited; None: all since `since`


@dataclass(frozen=True, slots=True)
class EngineResidency:
    """One engine's live state, as the gateway knows it."""

    residents: tuple[Resident, ...] = ()
    waiting: tuple[Waiter, ...] = ()  # first come first
    shared_prefix_tokens: int = 0  # learned; the policy's value wins when set
    # (client, n): the engine's n-th admission was this client's latest (the queue's share)
    served: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Capacity:
    kv_tokens: int | None  # None: unknown, nothing is held
    max_num_seqs: int


@dataclass(frozen=True, slots=True)
class Turn:
    key: str  # the session's key
    prefix_tokens: int  # its prefix once this turn's prompt is in (the table's, or estimated)
    keeps_place: bool = False  # a compaction or auxiliary request
    client: str = ""  # whose session (the queue's share)


@dataclass(frozen=True, slots=True)
class Verdict:
    admit: bool
    reason: str  # one of ADMIT_REASONS or WAIT_REASONS
    detail: str = ""
    ends: tuple[str, ...] = ()  # residencies this decision ends (idle ones, a yield)
    ahead: int = 0  # sessions waiting before this one


def held_tokens(prefixes: Iterable[int], shared: int) -> int:
    """KV tokens the prefixes take with `shared` tokens of each one the same blocks."""
    values = list(prefixes)
    if not values:
        return 0
    once = min(shared, max(values))
    return once + sum(max(0, p - once) for p in values)


def admission(
    turn: Turn,
    engine: EngineResidency,
    capacity: Capacity,
    spec: SessionAdmissionSpec,
    now: float,
) -> Verdict:
    """Admit `turn` on the engine now, or let it wait, and why."""
    if not spec.enabled:
        return Verdict(True, "off", "session-aware admission is off")
    kv = capacity.kv_tokens
    if kv is None:
        return Verdict(True, "kv-unknown", "the engine's KV tokens are unknown: nothing is held")
    live = [r for r in engine.residents if r.idle_since is None or now - r.idle_since < spec.idle_s]
    idle = tuple(r.key for r in engine.residents if r not in live)
    others = [w for w in engine.waiting if w.key != turn.key and w.present]
    mine = next((r for r in live if r.key == turn.key), None)
    if mine is not None and turn.keeps_place:
        return Verdict(
            True, "class", "a compaction or auxiliary request of a resident session", idle
        )
    if mine is not None:
        waited = max((_waited(w, now) for w in others), default=0.0)
        if spec.max_wait_s is not None and others and waited >= spec.max_wait_s:
            return Verdict(
                False,
                "yield",
                f"a session has waited {waited:.0f} s >= max_wait_s "
                f"{spec.max_wait_s:g} s: this turn boundary ends this session's residency",
                (*idle, turn.key),
                len(others),
            )
        return Verdict(True, "resident", "the engine holds this session's prefix", idle)
    shared = spec.shared_prefix_tokens
    shared = engine.shared_prefix_tokens if shared is None else shared
    held = held_tokens((r.prefix_tokens for r in live), shared)
    need = held_tokens([*(r.prefix_tokens for r in live), turn.prefix_tokens], shared)
    reserve = capacity.max_num_seqs * spec.turn_tokens
    budget = spec.fit_fraction * kv
    ahead = _ahead(engine, turn, now)
    arithmetic = (
        f"{len(live)} resident sessions hold {held:,} tokens; with this one's {turn.prefix_tokens:,}"
        f" (shared {shared:,} counted once) {need:,} + {capacity.max_num_seqs} x "
        f"{spec.turn_tokens:,} = {need + reserve:,} "
    )
    fits = need + reserve <= budget
    verdict = "<=" if fits else ">"
    arithmetic += f"{verdict} {spec.fit_fraction:g} x {kv:,} KV tokens = {budget:,.0f}"
    if not live and not ahead:
        return Verdict(True, "fits" if fits else "alone", arithmetic, idle)
    if fits and not ahead:
        return Verdict(True, "fits", arithmetic, idle)
    if fits:
        return Verdict(
            False, "queue", f"{ahead} sessions wait before it; {arithmetic}", idle, ahead
        )
    return Verdict(False, "full", arithmetic, idle, ahead)


def _waited(w: Waiter, now: float) -> float:
    return now - w.since if w.waited_s is None else w.waited_s


def _ahead(engine: EngineResidency, turn: Turn, now: float) -> int:
    """Sessions waiting now that go before `turn`'s place (at its client's end when it has
    none), round by round: each client's oldest waiting session, the client served least
    recently on this engine first, then each one's next, and so on."""
    served = dict(engine.served)
    mine = next((w for w in engine.waiting if w.key == turn.key), None)
    rows = [w for w in engine.waiting if w.present and w.key != turn.key]
    rows.append(Waiter(turn.key, now if mine is None else mine.since, True, turn.client))
    rows.sort(key=lambda w: w.since)
    rounds: dict[str, int] = {}
    order = []
    for i, w in enumerate(rows):
        client = w.client or "\0" + w.key  # unknown (another replica's): a client of its own
        rank = rounds.get(client, 0)
        rounds[client] = rank + 1
        order.append((rank, served.get(client, -1), i, w.key))
    order.sort()
    return next(n for n, row in enumerate(order) if row[3] == turn.key)


def expected_wait_s(verdict: Verdict, spec: SessionAdmissionSpec) -> float:
    """A waiting turn's expected wait, for the stickiness arithmetic: each session before it,
    and it, waits for one residency to end, after `idle_s` at most, or once it waited
    `max_wait_s`, whichever is sooner. 0 for an admitted turn."""
    if verdict.admit:
        return 0.0
    per = spec.idle_s if spec.max_wait_s is None else min(spec.idle_s, spec.max_wait_s)
    bound = float("inf") if spec.max_wait_s is None else spec.max_wait_s
    return min(bound, (verdict.ahead + 1) * per)


def move_instead(
    session: SessionView,
    held: str,
    held_spec: BackendSpec,
    wait_s: float,
    candidates: Iterable[tuple[str, BackendSpec, Verdict]],
    default_turns: float,
) -> MoveCost | None:
    """The first candidate engine that admits the turn now where moving pays, counting the
    wait on the held engine as a gain (policies/stickiness.py); None: stay and wait."""
    for name, spec, verdict in candidates:
        if not verdict.admit or name == held:
            continue
        move = move_cost(session, held, held_spec, name, spec, default_turns, wait_s)
        if move.pays:
            return move
    return None
