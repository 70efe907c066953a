"""The per-request log: one SQLite row per finished request, written off the request path.

`RequestLog.sink` runs on the gateway's event loop inside the request, so it only snapshots the
record into a tuple and appends it to a bounded list: no I/O, no clock, no quantiles. A
background task hands the list to a worker thread every `batch_interval_s`; the thread computes
the per-request figures (ITL quantiles, decode rate) and writes them in one transaction.

A full disk, a locked or unwritable database never reaches a client: the error is counted, logged
at most once a minute, and the rows stay buffered (up to the bound) until a later batch succeeds.
Prompts and completions are never seen here, let alone stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sqlite3
import time
from collections.abc import Sequence
from operator import truediv
from pathlib import Path
from typing import TYPE_CHECKING, Any

from policies.agent_signals import AgentSignals
from proxy.backends.prefix import NOTHING, PrefixLoss
from proxy.bounds import storable
from proxy.observe.requestlog_schema import INSERT, open_db
from proxy.observe.stats import weighted_at
from proxy.record.measure import Measurement

if TYPE_CHECKING:
    from prometheus_client import Counter

    from proxy.record.request import RequestRecord

log = logging.getLogger(__name__)

# What `sink` keeps: the record's scalars plus its Measurement, whose per-step lists are read
# (not copied) by the writer thread. Nothing mutates a record after the gateway finished it.
Pending = tuple[
    float,
    str,
    str,
    str,
    str,
    str,
    bool,
    str | None,
    float | None,
    bool,
    int,
    str,
    str,
    Measurement,
    str,
    str,
    str,
    AgentSignals,
    str,
    tuple[str, ...],
    PrefixLoss,
]
Row = tuple[Any, ...]

# The writer thread shares the GIL with the event loop; without hand-backs the loop waits up to
# the 5 ms switch interval each time it wakes (measured: median timer lag 5.2 ms -> 0.35 ms).
_ROWS_PER_GIL_SLICE = 8  # rows built (ITL sort, ~40 us each at 512 tokens) per hand-back
_ROWS_PER_INSERT_SLICE = 64  # rows bound and inserted (~4 us each) per hand-back


# --- per-request figures: pure functions -------------------------------------------------------


def itl_quantiles(
    step_gaps: Sequence[float], step_tokens: Sequence[int]
) -> tuple[float | None, float | None]:
    """(p50, p95) of the per-token inter-token latency: a step of gap g that produced t tokens
    counts as t tokens of g/t each (as `Measurement.itl_per_token`).

    Computed on the steps with weights rather than on the expanded per-token list, and sorting
    indices by a float key rather than (value, weight) tuples: the same result at a fraction of
    the cost, which matters because the writer thread holds the GIL (and so delays the event
    loop) while it builds rows.
    """
    if len(step_gaps) != len(step_tokens):
        raise ValueError(f"{len(step_gaps)} step gaps for {len(step_tokens)} steps")
    total = sum(step_tokens)
    if total <= 0:
        return None, None
    values = list(map(truediv, step_gaps, step_tokens))
    order = sorted(range(len(values)), key=values.__getitem__)
    return (
        weighted_at(values, step_tokens, order, total, 0.50),
        weighted_at(values, step_tokens, order, total, 0.95),
    )


def decode_tokens_per_s(step_gaps: Sequence[float], step_tokens: Sequence[int]) -> float | None:
    """Decode tokens over decode time: the prefill's first token and its wait are excluded,
    so a long prompt does not hide a slow decode (or the reverse)."""
    seconds = sum(step_gaps)
    if not step_tokens or seconds <= 0:
        return None
    return sum(step_tokens) / seconds


def row_of(p: Pending) -> Row:
    """The SQLite row for one pending record (run in the writer thread: it sorts ITLs)."""
    (
        wall,
        rid,
        client,
        route,
        variant,
        reason,
        canary,
        cclass,
        temp,
        tdef,
        conc,
        outcome,
        version,
        m,
        session,
        agent,
        continued_from,
        sig,
        turn_state,
        adapted,
        prefix,
    ) = p
    gaps, tokens = m.itl_steps()
    p50, p95 = itl_quantiles(gaps, tokens)
    phases = m.phases()
    return (
        wall,
        rid,
        client,
        route,
        variant,
        reason,
        int(canary),
        cclass,
        temp,
        int(tdef),
        conc,
        m.prompt_tokens,
        m.cached_tokens,
        m.completion_tokens,
        m.ttft,
        p50,
        p95,
        m.acceptance,
        decode_tokens_per_s(gaps, tokens),
        m.e2e,
        m.finish_reason,
        outcome,
        version,
        m.tps_source,
        phases.get("gateway"),
        phases.get("engine_headers"),
        session or None,
        agent or None,
        continued_from or None,
        sig.request_class or None,
        sig.agent_type or None,
        sig.compaction or None,
        None if sig.context_compacted is None else int(sig.context_compacted),
        sig.durations_text or None,
        sig.prompt_id or None,
        sig.turn_id or None,
        turn_state or None,
        ",".join(adapted) or None,
        *_prefix(prefix),
    )


def _prefix(p: PrefixLoss | None) -> tuple[int | None, int | None, str | None, str | None]:
    if p is None or p is NOTHING:  # not a session turn compared with its previous one
        return None, None, None, None
    return p.expected, p.lost, p.cause or None, p.where or None


# --- the database, used only from the writer thread (one call at a time) -----------------------


# A row SQLite cannot take (a value it cannot bind, text that is not UTF-8, a NULL where the
# schema says NOT NULL): the row's fault, not the database's. Any other error is the database's
# (locked, full, moved) and the whole batch is kept for the next try.
_ROW_ERRORS = (
    OverflowError,
    ValueError,
    TypeError,
    sqlite3.InterfaceError,
    sqlite3.IntegrityError,
    sqlite3.ProgrammingError,
)


def write_rows(conn: sqlite3.Connection, rows: Sequence[Row]) -> int:
    """One transaction for the whole batch: one fsync-free commit instead of one per row.

    A slice with a row SQLite refuses is inserted again row by row, so that one bad row costs
    only itself. Returns the rows refused (not written)."""
    refused = 0
    conn.execute("BEGIN IMMEDIATE")
    try:
        for start in range(0, len(rows), _ROWS_PER_INSERT_SLICE):
            if start:
                time.sleep(0)  # executemany binds in C holding the GIL: let the loop in between
            part = rows[start : start + _ROWS_PER_INSERT_SLICE]
            conn.execute("SAVEPOINT part")
            try:
                conn.executemany(INSERT, part)
            except _ROW_ERRORS:
                conn.execute("ROLLBACK TO part")
                refused += _write_one_by_one(conn, part)
            conn.execute("RELEASE part")
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        raise
    return refused


def _write_one_by_one(conn: sqlite3.Connection, rows: Sequence[Row]) -> int:
    refused = 0
    for row in rows:
        try:
            conn.execute(INSERT, row)
        except _ROW_ERRORS:
            refused += 1
    return refused


def used_bytes(conn: sqlite3.Connection) -> int:
    """Bytes in use in the main file (free pages are reused, so they do not count)."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    size: int = conn.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def _vacuum(conn: sqlite3.Connection) -> None:
    """Give free pages back to the file system. The pragma frees one page per step and returns
    no columns, so `execute` steps it once (one page); executescript steps it to the end."""
    conn.executescript("PRAGMA incremental_vacuum")


def apply_retention(
    conn: sqlite3.Connection, *, now: float, max_age_s: float, max_bytes: int
) -> int:
    """Delete rows older than max_age_s, then the oldest rows until under max_bytes.

    Size is brought to 90% of the bound so the next batches do not trigger it again at once.
    Returns the number of rows deleted.
    """
    deleted = conn.execute("DELETE FROM requests WHERE time < ?", (now - max_age_s,)).rowcount
    for _ in range(8):  # each pass deletes the estimated share; indexes make it approximate
        used = used_bytes(conn)
        if used <= max_bytes:
            break
        count = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        if count == 0:
            break
        share = 1.0 - 0.9 * max_bytes / used
        n = max(1, math.ceil(count * share))
        deleted += conn.execute(
            "DELETE FROM requests WHERE rowid IN "
            "(SELECT rowid FROM requests ORDER BY time LIMIT ?)",
            (n,),
        ).rowcount
        _vacuum(conn)
    _vacuum(conn)
    # Else the WAL keeps the size the deletions had; a reader mid-query may defer it to next time.
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return int(deleted)


class RequestLog:
    """Batched, bounded, failure-proof SQLite log of finished requests.

    Wire it with `gw.sinks.append(log.sink)`, `await log.start()` at startup and
    `await log.stop()` at shutdown.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_age_s: float = 30 * 86400,
        max_bytes: int = 512 * 2**20,
        batch_interval_s: float = 0.5,
        max_buffered: int = 100_000,
        retention_interval_s: float = 300.0,
        busy_timeout_s: float = 2.0,
        error_log_interval_s: float = 60.0,
        dropped_counter: Counter | None = None,
    ) -> None:
        self.path = path
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self.batch_interval_s = batch_interval_s
        self.max_buffered = max_buffered
        self.retention_interval_s = retention_interval_s
        self.busy_timeout_s = busy_timeout_s
        self.error_log_interval_s = error_log_interval_s
        self.written = 0
        self.dropped = 0  # buffer full, or a record that could not be turned into a row
        # specrouter_requestlog_dropped_total (proxy/observe/metrics.py), when the gateway runs
        self.dropped_counter = dropped_counter
        self.write_errors = 0  # failed batches (each batch is retried, not lost)
        self.deleted = 0  # rows removed by retention
        self._buffer: list[Pending] = []
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lock = asyncio.Lock()  # one writer-thread call at a time: the connection is shared
        self._next_retention = 0.0
        self._last_error_log = -math.inf
        self._unlogged_errors = 0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    # --- the request path -------------------------------------------------------------------

    def sink(self, record: RequestRecord) -> None:
        """Called on the event loop for every finished request: snapshot and append, O(1)."""
        try:
            if len(self._buffer) >= self.max_buffered:
                self._drop("buffer_full")
                return
            r = record
            self._buffer.append(
                (
                    r.started_wall,
                    r.request_id,
                    r.client,
                    r.route,
                    r.backend,
                    r.reason,
                    r.canary,
                    r.content_class,
                    r.temperature,
                    r.temperature_defaulted,
                    r.concurrency,
                    r.outcome,
                    r.policy_version,
                    r.m,
                    r.session,
                    r.agent,
                    r.continued_from,
                    r.signals,
                    r.turn_state,
                    r.adapted,
                    r.prefix,
                )
            )
        except Exception:  # a log must never fail the request that feeds it
            self._drop("unreadable")

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._closing.clear()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="requestlog")

    async def stop(self) -> None:
        """Stop the batch loop, write what is buffered (one last try), close the database.

        The loop is asked to end rather than cancelled: a cancel mid-batch would abandon a
        writer thread still using the connection, and the final flush would share it.
        """
        if self._task is not None:
            self._closing.set()
            await self._task
            self._task = None
        await self.flush()
        if self._buffer:
            log.error(
                "request log: %d records not written at shutdown (%s)", len(self._buffer), self.path
            )
        async with self._lock:
            await asyncio.to_thread(self._close)

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), self.batch_interval_s)
            try:
                await self.flush()
                if time.monotonic() >= self._next_retention:
                    await self.retain()
            except Exception:  # a bug here must not end the loop and silently stop the log
                log.exception("request log: batch loop error")

    # --- batches ----------------------------------------------------------------------------

    async def flush(self) -> None:
        """Write everything buffered now. Never raises on database or disk errors."""
        async with self._lock:
            batch, self._buffer = self._buffer, []
            if not batch:
                return
            try:
                written, bad = await asyncio.to_thread(self._write, batch)
            except (sqlite3.Error, OSError) as exc:
                self._requeue(batch)
                self._failed(exc)
                return
            self.written += written
            if bad:
                self._drop("unstorable", bad)

    async def retain(self) -> None:
        """Apply retention now (the batch loop does it every retention_interval_s)."""
        async with self._lock:
            self._next_retention = time.monotonic() + self.retention_interval_s
            try:
                self.deleted += await asyncio.to_thread(self._retain, time.time())
            except (sqlite3.Error, OSError) as exc:
                self._failed(exc)

    def _requeue(self, batch: list[Pending]) -> None:
        """Put a failed batch back in front of what arrived meanwhile, within the bound: the
        newest records are the ones dropped, so the log keeps a contiguous stretch."""
        merged = batch + self._buffer
        keep = merged[: self.max_buffered]
        if len(merged) > len(keep):
            self._drop("buffer_full", len(merged) - len(keep))
        self._buffer = keep

    def _drop(self, reason: str, n: int = 1) -> None:
        """Rows lost, counted (on the event loop): `reason` is one of DROP_REASONS."""
        self.dropped += n
        if self.dropped_counter is not None:
            self.dropped_counter.labels(reason).inc(n)

    def _failed(self, exc: BaseException) -> None:
        self.write_errors += 1
        self._unlogged_errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= self.error_log_interval_s:  # a full disk repeats
            log.error(
                "request log %s: %d write error(s), %d buffered, %d dropped; last: %s",
                self.path,
                self._unlogged_errors,
                len(self._buffer),
                self.dropped,
                exc,
            )
            self._last_error_log, self._unlogged_errors = now, 0

    # --- the writer thread --------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = open_db(self.path, self.busy_timeout_s)
        return self._conn

    def _write(self, batch: list[Pending]) -> tuple[int, int]:
        rows: list[Row] = []
        bad = 0
        for n, pending in enumerate(batch, 1):
            if n % _ROWS_PER_GIL_SLICE == 0:
                # Hand the GIL back: else the event loop, woken by a relayed chunk, waits up to
                # the 5 ms switch interval for it, and that wait lands in clients' ITL.
                time.sleep(0)
            try:
                row = row_of(pending)
            except Exception:  # one odd record must not block every batch behind it
                bad += 1
                continue
            if storable(row):  # an integer beyond 64 bits would fail the whole insert
                rows.append(row)
            else:
                bad += 1
        try:
            refused = write_rows(self._connection(), rows)
        except (sqlite3.Error, OSError):
            self._close()  # reopen next time: the file may have been moved or fixed
            raise
        return len(rows) - refused, bad + refused

    def _retain(self, now: float) -> int:
        return apply_retention(
            self._connection(), now=now, max_age_s=self.max_age_s, max_bytes=self.max_bytes
        )

    def _close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
