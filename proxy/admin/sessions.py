"""Dashboard logins: random server-side session ids, expiring, kept in memory.

The cookie holds only the id; the table is keyed by the id's digest, so neither a lookup's
timing nor a dump of this table gives a usable id. A restart logs everyone out.
"""

from __future__ import annotations

import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Callable

from proxy.auth import hash_key


class Sessions:
    def __init__(
        self,
        lifetime_s: float,
        *,
        max_sessions: int = 1000,
        per_token: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.lifetime_s, self.max_sessions, self.per_token = lifetime_s, max_sessions, per_token
        self._clock = clock
        self._open: OrderedDict[str, tuple[str, float]] = OrderedDict()  # digest -> name, end

    def open(self, name: str) -> str:
        """A new session for the token named `name`: its id, for the cookie.

        Past `per_token` sessions of one token, that token's oldest goes; past `max_sessions`
        in all, the oldest of the token holding the most. So logging in again and again with
        one token (1,001 logins once logged every admin out) ends only that token's sessions."""
        sid = secrets.token_urlsafe(32)
        self._open[hash_key(sid)] = (name, self._clock() + self.lifetime_s)
        mine = [k for k, (n, _) in self._open.items() if n == name]
        for key in mine[: max(0, len(mine) - self.per_token)]:
            del self._open[key]
        while len(self._open) > self.max_sessions:
            counts = Counter(n for n, _ in self._open.values())
            most = counts.most_common(1)[0][0]
            del self._open[next(k for k, (n, _) in self._open.items() if n == most)]
        return sid

    def name(self, sid: str | None) -> str | None:
        """The token name of a live session, or None (unknown or expired)."""
        if not sid:
            return None
        key = hash_key(sid)
        entry = self._open.get(key)
        if entry is None:
            return None
        if entry[1] <= self._clock():
            del self._open[key]
            return None
        return entry[0]

    def close(self, sid: str | None) -> None:
        if sid:
            self._open.pop(hash_key(sid), None)
