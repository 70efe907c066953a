"""The prefix cache: computed KV blocks by chained block hash, least recently used out first.

A block's hash chains its tokens with the previous block's hash, as vLLM's does, so a block hits
only after the same whole prefix. Prompt blocks and the blocks a sequence filled while decoding
are hashed alike (`chain`), so the next turn, whose prompt holds this one's answer, hits both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq


def chain(ids: Seq[int], block_size: int, prev: int = 0) -> list[int]:
    """The hashes of the full blocks of `ids`, chained after the block whose hash is `prev`
    (0: from the start of the sequence); a partial last block has none."""
    out: list[int] = []
    h = prev
    for i in range(0, len(ids) - block_size + 1, block_size):
        h = hash((h, tuple(ids[i : i + block_size])))
        out.append(h)
    return out


class PrefixCache:
    """LRU of computed KV blocks, by chained block hash."""

    def __init__(self, capacity_blocks: int) -> None:
        self.total = max(1, capacity_blocks)
        self.capacity = self.total
        self.evictions = 0
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

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

    def insert(self, hashes: Seq[int]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        self._evict()

    def _evict(self) -> None:
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
            self.evictions += 1
