"""The prefix cache: computed KV blocks by chained block hash, least recently used out first."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq


class PrefixCache:
    """LRU of computed KV blocks, by chained block hash."""

    def __init__(self, capacity_blocks: int) -> None:
        self.capacity = max(1, capacity_blocks)
        self._blocks: OrderedDict[int, None] = OrderedDict()

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
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
