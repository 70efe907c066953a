"""The probe's progress lines on stderr."""

from __future__ import annotations

import sys
from typing import TextIO


class Progress:
    """One line per phase on stderr; a live countdown during the window on a terminal."""

    def __init__(self, out: TextIO | None = None, quiet: bool = False) -> None:
        self.out = out or sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.out, "isatty", lambda: False)())
        self._live = False

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self._live:
            self.out.write("\n")
            self._live = False
        self.out.write(text + "\n")
        self.out.flush()

    def live(self, text: str) -> None:
        if self.quiet or not self.tty:
            return
        self.out.write("\r" + text + "\033[K")
        self.out.flush()
        self._live = True


def fmt_duration(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"
