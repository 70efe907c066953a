"""The cyclic garbage collector paused while a request's parsed body is alive.

Parsing an agent's 400 KiB body makes thousands of containers, each of which reference
counting frees; the collector, left on, would walk them meanwhile (~0.3 ms). It is paused from
the parse until the request's tree is freed, which is when the request first waits: past the
engine write when nothing waits before it, so the engine starts on the request while the tree
is freed (~40 us of an agent's body, no longer ahead of the write). Pauses of several
requests overlap (each is one count): the collector resumes when the last ends, and only if
it was on when the first began.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any


class Pause:
    """One process's count of open pauses."""

    def __init__(self) -> None:
        self.open = 0
        self.resume = False  # the collector was on when the first open pause began

    def begin(self) -> None:
        if self.open == 0:
            self.resume = gc.isenabled()
            gc.disable()
        self.open += 1

    def end(self) -> None:
        self.open -= 1
        if self.open == 0 and self.resume:
            gc.enable()

    def end_when_waiting(self, tree: list[Any]) -> None:
        """Free `tree` (its last references) and end one pause once the running task first
        waits: the callback runs on the loop's next turn, after this task's synchronous path."""
        asyncio.get_running_loop().call_soon(self._free, tree)

    def _free(self, tree: list[Any]) -> None:
        tree.clear()
        self.end()


PAUSE = Pause()
