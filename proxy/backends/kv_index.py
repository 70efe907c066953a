"""What one engine's prefix cache holds, from its KV events (no I/O): block hashes and their
parents, never tokens, and per session the chain its last stored blocks extend.

A session's resident prefix is its chain's unbroken run of blocks from the first: vLLM
reports the blocks a request newly stores, chained after the last block it found cached
(`parent_block_hash`), so the chain is the stored blocks' ancestors (through any session's
blocks: a shared system prompt) and then their own. A block removed anywhere in it ends the
run there, whatever follows. An engine restart or a cleared cache (`AllBlocksCleared`) empties
the index and counts a reset; a gap no replay filled empties it without one (its state is
then unknown, not reset).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from proxy.backends.kv_events import Cleared, Event, Hash, Removed, Stored

SESSIONS_MAX: Final = 10_000  # as the session table (sessions.table_size's default)


@dataclass(frozen=True, slots=True)
class Residency:
    blocks: int  # the session's chain's unbroken run from its first block
    chain: int  # the blocks its chain has (what its last turn left)
    block_size: int
    resets: int  # the engine's resets seen since the session's chain was stored

    @property
    def tokens(self) -> int:
        return self.blocks * self.block_size


class KvIndex:
    """One engine's blocks, and each session's chain (the least recently stored dropped past
    `sessions_max`)."""

    def __init__(self, sessions_max: int = SESSIONS_MAX) -> None:
        self.parent: dict[Hash, Hash | None] = {}
        self.block_size = 0
        self.resets = 0  # engine restarts and cleared caches
        self.lost = 0  # times the index started again for a gap nothing filled
        self._chains: OrderedDict[str, tuple[tuple[Hash, ...], int]] = OrderedDict()
        self._max = sessions_max
        # Each session's run as last walked, with the removals counted then: until a block is
        # removed a run can only grow, so a lookup walks on from where it stopped (the event
        # loop reads every resident's, at each admission decision: 6,250 blocks for 100K
        # tokens of 16-token blocks).
        self._removals = 0
        self._runs: dict[str, tuple[int, int]] = {}

    def __len__(self) -> int:
        return len(self.parent)

    def apply(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Stored):
                self._stored(event)
            elif isinstance(event, Removed):
                self._removals += 1
                for h in event.hashes:
                    self.parent.pop(h, None)
            elif isinstance(event, Cleared):
                self.reset("engine-reset")

    def reset(self, why: str) -> None:
        """Start again empty: `lost` (a gap) is counted apart from the engine's resets."""
        self.parent.clear()
        self._removals += 1
        if why == "lost":
            self.lost += 1
        else:
            self.resets += 1

    def _stored(self, event: Stored) -> None:
        prev = event.parent
        for h in event.hashes:
            self.parent[h] = prev
            prev = h
        if event.block_size:
            self.block_size = event.block_size
        if event.session is None or not event.hashes:
            return
        chain = (*self._ancestors(event.parent), *event.hashes)
        self._chains[event.session] = (chain, self.resets)
        self._chains.move_to_end(event.session)
        self._runs.pop(event.session, None)
        while len(self._chains) > self._max:
            self._runs.pop(self._chains.popitem(last=False)[0], None)

    def _ancestors(self, h: Hash | None) -> tuple[Hash, ...]:
        """The chain up to `h`, from the first block; where the ancestry breaks (a block the
        index does not hold) the missing block heads it, so its run from the first is 0."""
        out: list[Hash] = []
        seen = 0
        while h is not None and h in self.parent and seen <= len(self.parent):
            out.append(h)
            h = self.parent[h]
            seen += 1
        if h is not None:  # an ancestor the index does not hold: the run from the first is 0
            out.append(h)
        out.reverse()
        return tuple(out)

    def residency(self, session: str) -> Residency | None:
        """The session's resident prefix on this engine, or None when it stored nothing here
        since the index began."""
        found = self._chains.get(session)
        if found is None:
            return None
        chain, resets_then = found
        memo = self._runs.get(session)
        run = memo[1] if memo is not None and memo[0] == self._removals else 0
        while run < len(chain) and chain[run] in self.parent:
            run += 1
        self._runs[session] = (self._removals, run)
        return Residency(run, len(chain), self.block_size, self.resets - resets_then)
