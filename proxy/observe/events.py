"""The gateway's recent events, in memory: backend health transitions, repairs, policy changes
and refused policy files. Each is recorded next to the log line that reports it, and shown on
`/admin/status` and the dashboard. Bounded: the last `MAX_EVENTS`, each detail cut to
`MAX_DETAIL` characters (a refused policy lists every problem it has)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Literal

MAX_EVENTS = 100
MAX_DETAIL = 500

EventKind = Literal[
    "backend_up",
    "backend_down",
    "backend_starting",
    "repair_started",
    "repair_finished",
    "policy_applied",
    "policy_refused",
]


@dataclass(frozen=True, slots=True)
class Event:
    time: float  # wall clock
    kind: EventKind
    backend: str | None = None
    version: str | None = None
    detail: str = ""


class EventLog:
    def __init__(self, maxlen: int = MAX_EVENTS) -> None:
        self._events: deque[Event] = deque(maxlen=maxlen)

    def add(
        self,
        kind: EventKind,
        *,
        backend: str | None = None,
        version: str | None = None,
        detail: str = "",
    ) -> Event:
        if len(detail) > MAX_DETAIL:
            detail = detail[: MAX_DETAIL - 1] + "…"
        event = Event(time.time(), kind, backend, version, detail)
        self._events.append(event)
        return event

    def __len__(self) -> int:
        return len(self._events)

    def rows(self) -> list[dict[str, Any]]:
        """Oldest first, as plain dicts (the status model, the dashboard snapshot)."""
        return [asdict(e) for e in self._events]
