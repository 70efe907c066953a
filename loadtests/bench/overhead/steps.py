"""CPU time of named steps of the request path, inside the live path (`profile_request
--steps`): each step's function wrapped with `time.process_time` around it, summed per body.

Timed where they run, between the request's other work, so a step is measured as warm or cold
as it is there (a 400 KiB parse leaves the caches cold for what follows), unlike the same call
repeated alone. Each wrapped call adds two clock reads (~1 us); steps nest (`_decide` includes
`release_tree`). Only functions that do not await are wrapped: a step's time is its own.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from typing import Any

from proxy.relay import app, exchange, forward

# (label, owner, attribute): the owner's attribute is the function the request path calls.
STEPS: tuple[tuple[str, Any, str], ...] = (
    ("parse+checks (_parse)", app.PublicApp, "_parse"),
    ("  checks+write (check_fields)", app, "check_fields"),
    ("decide (_decide)", app.PublicApp, "_decide"),
    ("  session_of", app, "session_of"),
    ("  request_view", app, "request_view"),
    ("  policy decide", app, "decide"),
    ("  release_tree (tree freed)", exchange.Exchange, "release_tree"),
    ("adapt", forward, "adapt"),
    ("upstream_pieces", forward, "upstream_pieces"),
)


class StepClock:
    """Seconds of CPU per step label, since the last `take`."""

    def __init__(self) -> None:
        self.spent: collections.defaultdict[str, float] = collections.defaultdict(float)
        self._undo: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        for label, owner, attr in STEPS:
            original = getattr(owner, attr)
            self._undo.append((owner, attr, original))
            setattr(owner, attr, self._timed(label, original))

    def uninstall(self) -> None:
        for owner, attr, original in reversed(self._undo):
            setattr(owner, attr, original)
        self._undo.clear()

    def _timed(self, label: str, f: Callable[..., Any]) -> Callable[..., Any]:
        spent = self.spent

        def timed(*args: Any, **kwargs: Any) -> Any:
            c0 = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[label] += time.process_time() - c0

        return timed

    def take(self) -> dict[str, float]:
        """The seconds per step since the last take, and start again."""
        out = dict(self.spent)
        self.spent.clear()
        return out


def report(name: str, spent: dict[str, float], requests: int) -> str:
    """One body's steps, in microseconds of CPU per request."""
    cells = [
        f"    {label:<32} {spent.get(label, 0.0) / requests * 1e6:8.1f} us" for label, _, _ in STEPS
    ]
    return f"  {name}: CPU per request by step ({requests} requests)\n" + "\n".join(cells)
