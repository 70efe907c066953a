"""The prefix cache: computed KV blocks by chained block hash, least recently used out first.

A block's hash chains its tokens with the previous block's hash, as vLLM's does, so a block hits
only after the same whole prefix. Prompt blocks and the blocks a sequence filled while decoding
are hashed alike (`chain`), so the next turn, whose prompt holds this one's answer, hits both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Protocol


def chain(ids: Seq[int], block_size: int, prev: int = 0) -> list[int]:
    """The hashes of the full blocks of `ids`, chained after the block whose hash is `prev`
    (0: from the start of the sequence); a partial last block has none."""
    out: list[int] = []
    h = prev
    for i in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, tuple(ids[i : i + block_size])))
        out.append(h)
    return out


class KvListener(Protocol):
    """Told what the cache stores and evicts, as vLLM's KV events say it (kv_publisher.py)."""

    def stored(self, hashes: list[int], parent: int | None, session: str | None) -> None: ...

    def removed(self, hashes: list[int]) -> None: ...


class PrefixCache:
    """LRU of computed KV blocks, by chained block hash."""

    def __init__(self, capacity_blocks: int) -> None:
        self.total = max(1, capacity_blocks)
        self.capacity = self.total
        self.evictions = 0
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.listener: KvListener | None = None

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self) -> list[int]:
        """The blocks held, least recently used first."""
        return list(self._blocks)

    def resize(self, capacity_blocks: int) -> None:
        """Room left by the running sequences; blocks beyond it go, least recently used first."""
        self.capacity = min(self.total, max(0, capacity_blocks))
        self._evict()

    def match(self, hashes: Seq[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        return n

    def insert(
        self,
        hashes: Seq[int],
        *,
        parent: int | None = None,
        session: str | None = None,
        tail_first: bool = False,
    ) -> None:
        """`hashes` in chain order, after the block `parent` (None: from the sequence's start);
        `tail_first`: the last block is the most recently used (vLLM frees a request's blocks
        tail first), so it goes first when room is needed."""
        if self.listener is not None:
            self._tell_stored(hashes, parent, session)
        for h in reversed(hashes) if tail_first else hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        self._evict()

    def _tell_stored(self, hashes: Seq[int], parent: int | None, session: str | None) -> None:
        """One event per run of blocks the cache did not hold, chained after the block before
        it: vLLM reports newly stored blocks only."""
        assert self.listener is not None
        run: list[int] = []
        before = parent
        for h in hashes:
            if h in self._blocks:
                if run:
                    self.listener.stored(run, before, session)
                    run = []
                before = h
            else:
                run.append(h)
        if run:
            self.listener.stored(run, before, session)

    def _evict(self) -> None:
        gone: list[int] = []
        while len(self._blocks) > self.capacity:
            gone.append(self._blocks.popitem(last=False)[0])
            self.evictions += 1
        if gone and self.listener is not None:
            self.listener.removed(gone)
