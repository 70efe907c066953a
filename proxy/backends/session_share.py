"""The session table shared by replicas through Redis (`--redis-url`), off the request path.

The request path only reads and writes the local table (proxy/backends/session_table.py). A
local change queues the session's key (`changed`, one dict operation; a key already queued is
not queued twice, the flush reads its current row). Two background loops do the rest:

- flush, every `session_flush_s` (a row: its engine, last seen, prefix tokens, turns, output
  tokens, attained service by minute, proxy/backends/attained.py, and its client): one pipeline of `SET <prefix>:sess:<key> <row> EX idle_s` per
  queued key and `ZADD <prefix>:sess-changed <wall time> <key>`, the index of recent changes
  (trimmed past the idle horizon, so it holds at most one member per live session, and of
  members scored more than `FUTURE_TRIM_S` past Redis's own clock);
- pull, every `session_pull_s`: `ZRANGEBYSCORE` of the index since the last pull, `MGET` of
  those rows, each merged into the local table when it was seen later than ours (last seen
  wins; a replica's own rows are skipped).

Why a scan of the index, not pub/sub: a message published while a replica is disconnected or
not yet started is lost, the index is not; a replica starting, or back after Redis was away,
catches up with every session changed within the idle horizon, in the same two round trips.

Staleness: another replica sees a change within `session_flush_s + session_pull_s` (plus a
round trip). Rows carry wall-clock times, so replicas' clocks are assumed to agree within
`CLOCK_SKEW_S` (each pull reads that much of the index again; merging is idempotent). What lies
beyond that is not believed: a pull reads members scored up to now + `CLOCK_SKEW_S` only, its
cursor never passes now, and a row seen later than that is refused (counted, logged once). A
bad row or a replica whose clock is an hour ahead once moved every other replica's cursor an
hour on, and they shared nothing more until restarted; now only that replica is left out.

The turn-state secret (proxy/relay/turnstate.py), when none is configured, lives in Redis too:
each replica sets it if none is (`SET NX` of the one it holds, or a new one) and reads it, at
start and every `session_pull_s` after. A Redis restarted without persistence has lost it: the
first replica to look puts its own back (logged, counted in `errors_total{op="secret-lost"}`),
and a replica that finds another one (set meanwhile by a replica starting) takes it (logged,
`op="secret-changed"`); tokens signed with the old one are refused from then on, so the
replicas agree again within a pull.

Redis away: the gateway serves from its local table; the first failure is logged once, both
loops retry with a doubling backoff (at most `MAX_BACKOFF_S`), failures are counted in
`specrouter_session_share_errors_total`. The queue stays bounded (`session_queue_max` keys,
the oldest dropped and counted) whatever the outage's length.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Final

import orjson

from proxy.backends.attained import parse_pairs
from proxy.backends.redis_loops import (
    IO_TIMEOUT_S,
    RedisLoops,
)
from proxy.backends.session_table import SessionTable, SharedRow
from proxy.bounds import token_count
from proxy.observe.metrics import GatewayMetrics
from proxy.settings import Settings

if TYPE_CHECKING:
    from proxy.relay.turnstate import TurnState

log = logging.getLogger("specrouter.sessions")

CLOCK_SKEW_S: Final = 1.0
# Index members scored this far past Redis's clock are trimmed at each flush (by Redis's clock,
# so that a replica whose own clock is behind trims no one's fresh members).
FUTURE_TRIM_S: Final = 60.0
_TRIM_FUTURE: Final = """
local now = redis.call('TIME')
return redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (tonumber(now[1]) + tonumber(ARGV[1])), '+inf')
"""
PULL_BATCH: Final = 5_000  # index members per round trip; more are read at once after
PULL_PAGES: Final = 20  # round trips one pull makes at most (100,000 members); the rest next time
FLUSH_BATCH: Final = 5_000  # rows one flush sends at most; the rest stay queued for the next
# Each member of one flush gets its own score (the flush's wall time plus its rank times this):
# a page of the index then never ends inside a run of equal scores that the next page, read
# from the last score, would read again (6,000 members of one score once made every replica's
# pull read the same 5,000 forever).
SCORE_STEP_S: Final = 1e-6


class SessionShare(RedisLoops):
    def __init__(
        self,
        table: SessionTable,
        settings: Settings,
        metrics: GatewayMetrics,
        client: Any = None,
        turn_state: TurnState | None = None,
        known_client: Callable[[str], bool] = lambda name: False,
    ) -> None:
        import redis.asyncio as aioredis

        assert settings.redis_url is not None
        self.table = table
        self.flush_s, self.pull_s = settings.session_flush_s, settings.session_pull_s
        self.queue_max = settings.session_queue_max
        self._rows_key = f"{settings.redis_prefix}:sess:"
        self._index_key = f"{settings.redis_prefix}:sess-changed"
        # x-codex-turn-state's secret when none is configured: the first replica sets it
        self._secret_key = f"{settings.redis_prefix}:turn-state-secret"
        self.turn_state = turn_state
        self._redis: Any = client or aioredis.Redis.from_url(
            settings.redis_url,
            socket_timeout=IO_TIMEOUT_S,
            socket_connect_timeout=IO_TIMEOUT_S,
        )
        self.replica = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._queue: dict[str, None] = {}  # insertion-ordered: the oldest is dropped first
        self._cursor = time.time() - table.idle_s  # a new replica reads every live session
        self._down = False
        self._tasks: list[asyncio.Task[None]] = []
        self._rows = metrics.session_share
        self._errors = metrics.session_share_errors
        # A row's client is kept when the policy has it (eviction weighs rows by client);
        # another name is read as "" (clients stay few).
        self._known_client = known_client
        self._future_logged = False
        table.on_change = self.changed

    # The request path ---------------------------------------------------------------------

    def changed(self, key: str) -> None:
        queue = self._queue
        if key in queue:
            return
        if len(queue) >= self.queue_max:
            del queue[next(iter(queue))]
            self._rows.labels("dropped").inc()
        queue[key] = None

    def queued(self) -> int:
        return len(self._queue)

    # The background loops -----------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._every(self.flush_s, "flush", self.flush)),
            loop.create_task(self._every(self.pull_s, "pull", self.pull)),
        ]
        if self.turn_state is not None:
            secret = self._every(self.pull_s, "secret", self.secret, first_s=0.0)
            self._tasks.append(loop.create_task(secret))

    def _failed(self, op: str, exc: Exception) -> None:
        if not self._down:
            self._down = True
            log.warning(
                "Redis unreachable (%s: %s): sessions served from the local table, retrying",
                op,
                exc or type(exc).__name__,
            )

    def _reached(self) -> None:
        if self._down:
            self._down = False
            log.warning("Redis reachable again: sessions shared")

    async def secret(self) -> int | None:
        """The replicas' one turn-state secret: the one this replica holds (or a new one) set
        if none is (NX), then read. 1 once known, None while Redis holds none."""
        assert self.turn_state is not None
        held = self.turn_state.secret
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(self._secret_key, held or secrets.token_hex(32), nx=True)
        pipe.get(self._secret_key)
        created, value = await pipe.execute()
        if not value:
            return None
        value = value if isinstance(value, bytes) else str(value).encode()
        if held is not None and created:
            self._errors.labels("secret-lost").inc()
            log.warning(
                "Redis had lost the turn-state secret (restarted without persistence?): "
                "this replica's put back"
            )
        elif held is not None and value != held:
            self._errors.labels("secret-changed").inc()
            log.warning(
                "the turn-state secret in Redis is not this replica's (Redis restarted without "
                "persistence?): taking it; tokens signed before are refused"
            )
        self.turn_state.secret = value
        return 1

    async def flush(self) -> int | None:
        """Send the queued rows; on failure they are queued again (bounded). Rows sent, None
        when there was nothing to send (no round trip)."""
        if not self._queue:
            return None
        queue = self._queue
        keys = list(itertools.islice(queue, FLUSH_BATCH))  # the oldest first
        for key in keys:
            del queue[key]
        wall = time.time()
        offset = wall - time.perf_counter()  # the table's monotonic clock -> wall clock
        ttl = max(1, int(self.table.idle_s))
        pipe = self._redis.pipeline(transaction=False)
        index: dict[str, float] = {}
        for key in keys:
            row = self.table.get(key)
            if row is None:
                continue  # dropped from the table meanwhile
            value = orjson.dumps(
                (
                    self.replica,
                    row.engine,
                    row.last_seen + offset,
                    row.prefix_tokens,
                    row.turns,
                    row.tokens_out,
                    row.attained.pairs(offset),
                    row.client,
                )
            )
            pipe.set(self._rows_key + key, value, ex=ttl)
            index[key] = wall + len(index) * SCORE_STEP_S
        if not index:
            return None
        pipe.zadd(self._index_key, index)
        pipe.zremrangebyscore(self._index_key, "-inf", wall - self.table.idle_s)
        pipe.eval(_TRIM_FUTURE, 1, self._index_key, FUTURE_TRIM_S)
        try:
            *_, future = await pipe.execute()
        except BaseException:
            for key in keys:  # newer changes queued meanwhile keep their place
                self.changed(key)
            raise
        self._rows.labels("sent").inc(len(index))
        if future:
            self._rows.labels("future").inc(future)
            self._from_the_future(f"{future} index members scored more than {FUTURE_TRIM_S:.0f} s")
        return len(index)

    async def pull(self) -> int:
        """Merge the rows other replicas changed since the last pull. Rows taken.

        Pages follow one another by offset from the cursor, so a page that ends inside a run
        of equal scores (an older replica's flush) never makes the next page read it again;
        at most PULL_PAGES pages a pull."""
        taken = 0
        last: float | None = None
        now = time.time()
        for page in range(PULL_PAGES):
            found = await self._redis.zrangebyscore(
                self._index_key,
                self._cursor,
                now + CLOCK_SKEW_S,  # later: a bad row, or a clock ahead (not believed)
                start=page * PULL_BATCH,
                num=PULL_BATCH,
                withscores=True,
            )
            if not found:
                break
            keys = [k for k in (_member_key(m) for m, _ in found) if k is not None]
            values = await self._redis.mget([self._rows_key + k for k in keys]) if keys else []
            offset = time.time() - time.perf_counter()
            for key, value in zip(keys, values, strict=True):
                if value is not None:
                    taken += self._merge(key, value, offset)
            last = float(found[-1][1])
            if len(found) < PULL_BATCH:
                # Read the last CLOCK_SKEW_S again next time: a replica whose clock is behind
                # may still add changes there.
                self._cursor = min(max(self._cursor, last - CLOCK_SKEW_S), now)
                return taken
        if last is not None:  # PULL_PAGES full pages: go on from the last score next time
            self._cursor = min(max(self._cursor, last), now)
        return taken

    def _from_the_future(self, what: str) -> None:
        if not self._future_logged:
            self._future_logged = True
            log.warning(
                "%s past now: a bad row, or a replica whose clock is ahead of this one's by "
                "more than %.0f s (its sessions are not shared); not logged again",
                what,
                CLOCK_SKEW_S,
            )

    def _merge(self, key: str, value: bytes, offset: float) -> int:
        try:
            # Older versions send no attained buckets (before fairness), no client.
            replica, engine, seen, prefix, turns, out, *rest = orjson.loads(value)
        except (orjson.JSONDecodeError, TypeError, ValueError):
            return 0  # not a row this version wrote: ignored, it expires
        if replica == self.replica:
            return 0
        shared = _row(engine, seen, prefix, turns, out, offset)
        buckets = parse_pairs(rest[0], offset) if rest else []
        if shared is not None and buckets is not None:
            client = rest[1] if len(rest) > 1 else ""
            client = client if isinstance(client, str) and self._known_client(client) else ""
            shared = replace(shared, attained=tuple(buckets), client=client)
        if shared is not None and shared.last_seen > time.perf_counter() + CLOCK_SKEW_S:
            self._from_the_future("a session row seen")
            shared = None
        if shared is None or buckets is None:
            self._rows.labels("refused").inc()
            return 0
        if not self.table.merge(key, shared):
            return 0
        self._rows.labels("merged").inc()
        return 1


_KEY = re.compile(r"s-[0-9a-f]{32}")  # policies/sessions.py's keys: nothing else is a member


def _member_key(member: object) -> str | None:
    """An index member as a session key; None for anything this version did not write (a
    non-UTF-8 member once stopped every pull)."""
    if isinstance(member, bytes):
        try:
            member = member.decode("ascii")
        except UnicodeDecodeError:
            return None
    return member if isinstance(member, str) and _KEY.fullmatch(member) else None


def _row(
    engine: object, seen: object, prefix: object, turns: object, out: object, offset: float
) -> SharedRow | None:
    """A row's fields as counts and a time, or None: `turns` 10^30 once reached the table,
    made the dashboard 500 and a flush drop every key queued with it."""
    counts = [token_count(v) for v in (prefix, turns, out)]
    if (
        not isinstance(engine, str)
        or not 0 < len(engine) <= 128
        or isinstance(seen, bool)
        or not isinstance(seen, int | float)
        or not math.isfinite(seen)
        or None in counts
    ):
        return None
    p, t, o = (c for c in counts if c is not None)
    return SharedRow(engine, float(seen) - offset, p, t, o)
