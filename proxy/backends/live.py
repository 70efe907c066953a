"""Live state of the backends as the gateway sees it: in-flight counts, health, scraped load.

Mutable, owned by one event loop. `snapshot()` freezes it into the `LiveState` the pure
policy engine reads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from policies.types import BackendState, GuardState, Health, LiveState


@dataclass(slots=True)
class BackendLive:
    health: Health = "up"
    in_flight: int = 0
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    acceptance: float | None = None
    consecutive_failures: int = 0
    consecutive_successes: int = 0


class LiveTracker:
    def __init__(self, *, fail_threshold: int = 3, recover_threshold: int = 2) -> None:
        self.backends: dict[str, BackendLive] = {}
        self.guards: dict[str, GuardState] = {}
        self.fail_threshold = fail_threshold
        self.recover_threshold = recover_threshold
        self.starting_until: dict[str, float] = {}
        self._snapshot: LiveState | None = None

    def get(self, name: str) -> BackendLive:
        b = self.backends.get(name)
        if b is None:
            b = self.backends[name] = BackendLive()
        return b

    def begin(self, name: str) -> None:
        self.get(name).in_flight += 1
        self._snapshot = None

    def end(self, name: str) -> None:
        self.get(name).in_flight -= 1
        self._snapshot = None

    def failure(self, name: str) -> None:
        """A passive signal (connect error, drop, timeout) or a failed health check."""
        b = self.get(name)
        b.consecutive_successes = 0
        b.consecutive_failures += 1
        if b.consecutive_failures >= self.fail_threshold:
            self._set_failed(name, b)

    def down_now(self, name: str) -> None:
        """A connection refused is proof enough: skip the backend until a health check passes."""
        b = self.get(name)
        b.consecutive_successes = 0
        b.consecutive_failures = max(b.consecutive_failures + 1, self.fail_threshold)
        self._set_failed(name, b)

    def starting(self, name: str, until: float) -> None:
        """The backend is (re)starting until `until` (monotonic): failures mean "starting"."""
        self.starting_until[name] = until
        b = self.get(name)
        if b.health == "down":
            b.health = "starting"
            self._snapshot = None

    def _set_failed(self, name: str, b: BackendLive) -> None:
        health: Health = (
            "starting" if time.monotonic() < self.starting_until.get(name, 0.0) else "down"
        )
        if b.health != health and not (b.health == "down" and health == "starting"):
            b.health = health
            self._snapshot = None

    def success(self, name: str) -> None:
        b = self.get(name)
        b.consecutive_failures = 0
        b.consecutive_successes += 1
        if b.health != "up" and b.consecutive_successes >= self.recover_threshold:
            b.health = "up"
            self._snapshot = None

    def set_health(self, name: str, health: Health) -> None:
        b = self.get(name)
        if b.health != health:
            b.health = health
            self._snapshot = None

    def set_scraped(
        self,
        name: str,
        *,
        running: int | None,
        waiting: int | None,
        kv_usage: float | None,
        acceptance: float | None,
    ) -> None:
        b = self.get(name)
        b.running, b.waiting, b.kv_usage, b.acceptance = running, waiting, kv_usage, acceptance
        self._snapshot = None

    def retain(self, names: set[str]) -> None:
        """Forget backends the policy no longer names (once nothing is in flight on them):
        a removed backend left in /admin/status and the dashboard for good."""
        gone = [n for n, b in self.backends.items() if n not in names and b.in_flight <= 0]
        for name in gone:
            del self.backends[name]
            self.starting_until.pop(name, None)
        if gone:
            self.guards = {n: g for n, g in self.guards.items() if n in names}
            self._snapshot = None

    def set_guards(self, guards: dict[str, GuardState]) -> None:
        self.guards = guards
        self._snapshot = None

    def snapshot(self) -> LiveState:
        if self._snapshot is None:
            self._snapshot = LiveState(
                backends={
                    n: BackendState(
                        health=b.health,
                        in_flight=b.in_flight,
                        running=b.running,
                        waiting=b.waiting,
                        kv_usage=b.kv_usage,
                        acceptance=b.acceptance,
                    )
                    for n, b in self.backends.items()
                },
                guards=dict(self.guards),
            )
        return self._snapshot
