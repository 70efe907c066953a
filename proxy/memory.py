"""Memory given back to the system after large inputs (glibc's allocator, via ctypes).

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so
after the first large frame every later one came from the heap, which fragments and never
shrinks: RSS climbed from 71 to 825 MB over an attack run and stayed there. Mapping every block
above 256 KiB fixed that, but made each agent-sized request (a 400 KiB body read, parsed,
checked and sent on: five such buffers) fault ~500 fresh pages in and out: ~1 ms of CPU per
request and the gateway's largest cost on agents' requests (docs/overhead-agents.md).

So: blocks up to `MMAP_THRESHOLD` (above the largest body) come from the heap, where the next
request reuses them without a fault, and what the heap holds free is given back by
`malloc_trim` (`Trimmer`, checked every second off the request path) once it exceeds
`TRIM_SLACK` with no request in flight, or `BUSY_SLACK` with some: memory comes back within
about a second of a burst, and steady traffic keeps the pages its next requests reuse
(trimming them every second re-faulted ~0.2 ms of pages per agent-sized request).
Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections.abc import Callable

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own maximum; a request body is at most 8 MiB by default
TRIM_THRESHOLD = 64 << 20  # the heap top shrinks on free beyond this
TRIM_SLACK = 16 << 20  # free heap bytes kept once the gateway is quiet (no request in flight)
BUSY_SLACK = 64 << 20  # ... while requests are in flight: their next buffers reuse these pages


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def tune_allocator(
    mmap_threshold: int = MMAP_THRESHOLD, trim_threshold: int = TRIM_THRESHOLD
) -> bool:
    """Fix glibc's thresholds (setting one turns its dynamic adjustment off); True if set."""
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )


class Trimmer:
    """Gives the heap's free memory back once it exceeds `slack` bytes while `quiet()`, or
    `busy_slack` bytes anyway (glibc 2.33+)."""

    def __init__(
        self,
        quiet: Callable[[], bool] = lambda: True,
        slack: int = TRIM_SLACK,
        busy_slack: int = BUSY_SLACK,
    ) -> None:
        self.quiet, self.slack, self.busy_slack = quiet, slack, busy_slack
        libc = _libc()
        self._info = getattr(libc, "mallinfo2", None)
        self._trim = getattr(libc, "malloc_trim", None)
        if self._info is not None:
            self._info.restype = _MallInfo2
        self.trims = 0

    @property
    def works(self) -> bool:
        return self._info is not None and self._trim is not None

    def free_bytes(self) -> int:
        """Bytes the heap holds free (glibc's `fordblks`); 0 where unknown."""
        return int(self._info().fordblks) if self._info is not None else 0

    def check(self) -> bool:
        """`malloc_trim(0)` when more free bytes than the slack; whether it trimmed."""
        if self._trim is None:
            return False
        free = self.free_bytes()
        if free <= self.slack or (free <= self.busy_slack and not self.quiet()):
            return False
        self._trim(0)
        self.trims += 1
        return True

    async def run(self, every_s: float = 1.0) -> None:
        if not self.works:
            return
        while True:
            await asyncio.sleep(every_s)
            self.check()
