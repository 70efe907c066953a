"""Memory given back to the system after large inputs (glibc's allocator, via ctypes).

glibc raises its mmap threshold each time a large mmapped block is freed (up to 32 MiB), so
after the first large frame every later one came from the heap, which fragments and never
shrinks: RSS climbed from 71 to 825 MB over an attack run and stayed there. A fixed threshold
keeps every buffer above it mmapped (given back on free), and a fixed trim threshold lets the
heap top shrink. Elsewhere (musl, macOS) this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator(mmap_threshold: int = 256 * 1024, trim_threshold: int = 1 << 20) -> bool:
    """Fix glibc's thresholds (setting one turns its dynamic adjustment off); True if set."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(
        mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    )
