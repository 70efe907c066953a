"""The simulated agents' impatience: each API's agent keeps the clocks and retries of the agent
that speaks it (docs/clients.md, "What the agents' watchdogs count"): chat is aider, Responses
is Codex, Messages is Claude Code, at their pinned versions' defaults. Pure: `Clock` is told what
arrived and when, and says when the next watchdog fires.

Durations are in the agent's (unscaled) seconds; the driver multiplies by its time scale.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Watchdogs:
    agent: str
    head_s: float | None  # no response head this long after the request: give up
    byte_idle_s: float | None  # after the head, no bytes at all (comments count) this long
    event_idle_s: float | None  # no data event it counts this long
    event_from_start: bool  # the event clock runs from the request (else from the head)
    ping_events_count: bool  # an Anthropic `ping` event re-arms the event clock
    watchdog_resends: int  # resends of the same request after a watchdog fired
    status_retries: int  # resends after a retried status or a lost connection
    retry_429: bool
    retry_after: bool  # waits the refusal's `retry-after` when it has one
    base_delay_s: float  # the n-th retry waits base * 2**n, at most max_delay_s
    max_delay_s: float


AGENTS: dict[str, Watchdogs] = {
    # aider 0.86.2: httpx's 600 s read timeout (its `request_timeout`) before the head and between
    # bytes; every error it retries shares one loop: 0.25 s doubling while at most 60 s (8 tries).
    "chat": Watchdogs(
        "aider 0.86.2", 600.0, 600.0, None, False, True, 8, 8, True, False, 0.25, 32.0
    ),
    # Codex 0.171.0: `stream_idle_timeout_ms` 300 s over parsed events from the head (comments are
    # dropped); `stream_max_retries` 5, `request_max_retries` 4 (5xx, not 429), 200 ms backoff.
    "responses": Watchdogs(
        "Codex 0.171.0", None, None, 300.0, False, True, 5, 4, False, True, 0.2, 30.0
    ),
    # Claude Code 2.1.197: API_TIMEOUT_MS 600 s to the head, the byte watchdog 300 s after it,
    # the event watchdog 300 s from the request over every event but `ping`; 10 retries.
    "messages": Watchdogs(
        "Claude Code 2.1.197", 600.0, 300.0, 300.0, True, False, 10, 10, True, True, 0.5, 32.0
    ),
}


def retries_status(w: Watchdogs, status: int) -> bool:
    """Whether the agent resends after this status (the SDKs' rule; aider's is wider)."""
    if status == 429:
        return w.retry_429
    return status >= 500 or status in (408, 409)


def retry_delay(w: Watchdogs, attempt: int, retry_after: float | None) -> float:
    """Seconds before the `attempt`-th resend (0-based)."""
    if w.retry_after and retry_after is not None:
        return retry_after
    return min(w.max_delay_s, w.base_delay_s * 2.0**attempt)


class Clock:
    """One attempt's watchdogs: `due()` is when the first of them fires (None: never)."""

    __slots__ = ("w", "head_due", "byte_due", "event_due", "headed", "_scale")

    def __init__(self, w: Watchdogs, now: float, scale: float = 1.0) -> None:
        self.w = w
        self.headed = False
        self.head_due = None if w.head_s is None else now + w.head_s * scale
        self.byte_due: float | None = None
        self.event_due = (
            now + w.event_idle_s * scale
            if w.event_idle_s is not None and w.event_from_start
            else None
        )
        self._scale = scale

    def head(self, now: float) -> None:
        self.headed, self.head_due = True, None
        if self.w.event_idle_s is not None and not self.w.event_from_start:
            self.event_due = now + self.w.event_idle_s * self._scale
        self.byte(now)

    def byte(self, now: float) -> None:
        if self.w.byte_idle_s is not None:
            self.byte_due = now + self.w.byte_idle_s * self._scale

    def event(self, now: float, ping: bool) -> None:
        if self.w.event_idle_s is not None and (self.w.ping_events_count or not ping):
            self.event_due = now + self.w.event_idle_s * self._scale

    def line(self, now: float, line: str, data: object) -> None:
        """One SSE line read at `now` (`data`: its parsed payload, if any). Every line is bytes;
        a `data:` line is an event every parser here passes to its loop, whatever its type (the
        gateway's Responses `keepalive` too: Codex re-arms its idle timer on the next parsed
        event, then drops a type it does not know); a comment (`: ping`) is only bytes."""
        self.byte(now)
        if line.startswith("data: "):
            self.event(now, ping=isinstance(data, dict) and data.get("type") == "ping")

    def due(self) -> float | None:
        dues = [d for d in (self.head_due, self.byte_due, self.event_due) if d is not None]
        return min(dues, default=None)

    def fired(self, now: float) -> str:
        """Which watchdog is due at `now` (for the turn's record)."""
        for name, due in (("head", self.head_due), ("byte", self.byte_due)):
            if due is not None and due <= now:
                return name
        return "event"
