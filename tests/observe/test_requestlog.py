"""The request log: real records in, a real SQLite file out, and no failure reaching a client."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from proxy.observe.requestlog import RequestLog, decode_tokens_per_s, itl_quantiles, row_of
from proxy.observe.requestlog_schema import COLUMNS, open_db
from proxy.observe.stats import quantile
from proxy.record.measure import Measurement
from proxy.record.request import RequestRecord


def make_record(
    i: int = 0,
    *,
    variant: str = "eagle3",
    steps: Sequence[tuple[float, int]] = ((0.020, 2), (0.030, 3), (0.025, 1)),
    ttft: float = 0.25,
    temperature: float | None = 0.7,
    defaulted: bool = False,
    concurrency: int = 1,
    outcome: str = "ok",
    wall: float | None = None,
    spec: dict[str, object] | None = None,
) -> RequestRecord:
    """A finished streaming request, fed through Measurement the way the relay feeds it."""
    m = Measurement(t_start=1000.0, stream=True)  # an event stream, as relayed
    m.t_first_byte = 1000.0 + ttft
    m.record_usage({"prompt_tokens": 120 + i, "prompt_tokens_details": {"cached_tokens": 64}})
    now, total = 1000.0 + ttft, 1
    m.record_tokens(total, now)  # the prefill's token
    for gap, tokens in steps:
        now, total = now + gap, total + tokens
        m.record_tokens(total, now)
    m.t_end = now + 0.001
    m.finish_reason = "stop"
    m.spec = spec
    return RequestRecord(
        request_id=f"req-{i}",
        client="alice",
        endpoint="/v1/chat/completions",
        route="code",
        backend=variant,
        reason="rule:code",
        canary=False,
        content_class="code",
        temperature=temperature,
        temperature_defaulted=defaulted,
        stream=True,
        status=200,
        outcome=outcome,
        concurrency=concurrency,
        policy_version="v3",
        started_wall=time.time() if wall is None else wall,
        m=m,
    )


def rows(path: Path) -> list[dict[str, object]]:
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY rowid")]
    finally:
        conn.close()


# --- pure figures -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        ([], 0.5, None),
        ([3.0], 0.05, 3.0),
        ([3.0], 0.95, 3.0),
        ([1.0, 2.0], 0.5, 1.5),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.5, 3.0),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.95, 4.8),
        ([1.0, 2.0, 3.0, 4.0, 5.0], 0.05, 1.2),
        ([0.0, 10.0], 1.0, 10.0),
        ([0.0, 10.0], 0.0, 0.0),
    ],
)
def test_quantile(values: list[float], q: float, expected: float | None) -> None:
    assert quantile(values, q) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("gaps", "tokens", "p50", "p95"),
    [
        ([], [], None, None),
        ([0.01], [1], 0.01, 0.01),
        ([0.03, 0.01, 0.02], [1, 1, 1], 0.02, 0.029),  # unsorted in
        ([0.01] * 19 + [0.5], [1] * 20, 0.01, 0.0345),  # one stall barely moves p95 with 20 tokens
        ([0.03, 0.04], [3, 1], 0.01, 0.0355),  # 0.01 x3, 0.04: p95 interpolates across steps
        ([0.04, 0.02, 0.03], [2, 1, 1], 0.02, 0.0285),  # equal values from different steps
    ],
)
def test_itl_quantiles(
    gaps: list[float], tokens: list[int], p50: float | None, p95: float | None
) -> None:
    assert itl_quantiles(gaps, tokens) == (pytest.approx(p50), pytest.approx(p95))


@pytest.mark.parametrize("seed", range(20))
def test_itl_quantiles_match_the_per_token_list(seed: int) -> None:
    """Weighted steps give what sorting Measurement.itl_per_token() would, without building it."""
    rng = random.Random(seed)
    m = Measurement(t_start=0.0)
    for _ in range(rng.randint(1, 60)):
        m.step_gaps.append(rng.choice((0.01, 0.02, rng.random() / 10)))
        m.step_tokens.append(rng.randint(1, 8))
    per_token = sorted(m.itl_per_token())
    assert itl_quantiles(m.step_gaps, m.step_tokens) == (
        pytest.approx(quantile(per_token, 0.5)),
        pytest.approx(quantile(per_token, 0.95)),
    )


@pytest.mark.parametrize(
    ("gaps", "tokens", "expected"),
    [
        ([], [], None),
        ([0.0], [1], None),  # no measurable decode time
        ([0.02, 0.03], [2, 3], 100.0),
        ([0.1], [1], 10.0),
        ([0.01, 0.01, 0.02], [1, 4, 1], 150.0),
    ],
)
def test_decode_tokens_per_s(gaps: list[float], tokens: list[int], expected: float | None) -> None:
    assert decode_tokens_per_s(gaps, tokens) == pytest.approx(expected)


def test_row_of_a_real_record() -> None:
    record = make_record(7, defaulted=True, concurrency=4)
    log = RequestLog(Path("unused"))
    log.sink(record)
    row = dict(zip(COLUMNS, row_of(log._buffer[0]), strict=True))
    assert row["request_id"] == "req-7" and row["variant"] == "eagle3"
    assert row["temperature"] == 0.7 and row["temperature_defaulted"] == 1
    assert row["concurrency"] == 4 and row["canary"] == 0
    assert row["prompt_tokens"] == 127 and row["cached_tokens"] == 64
    assert row["completion_tokens"] == 7
    assert row["ttft_s"] == pytest.approx(0.25)
    # per token: 0.01, 0.01, 0.01, 0.01, 0.01, 0.025 -> p50 0.01
    assert row["itl_p50_s"] == pytest.approx(0.01)
    assert row["itl_p95_s"] == pytest.approx(0.02125)
    assert row["tokens_per_step"] == pytest.approx(2.0)
    assert row["decode_tokens_per_s"] == pytest.approx(6 / 0.075)
    assert row["e2e_s"] == pytest.approx(0.326)
    assert row["finish_reason"] == "stop" and row["outcome"] == "ok"
    assert row["policy_version"] == "v3"


def test_engine_reported_acceptance_wins() -> None:
    log = RequestLog(Path("unused"))
    # 6 tokens after the first in 3 chunks; the engine counted 4 steps (one held back)
    log.sink(make_record(spec={"num_accepted_draft_tokens": 2, "num_spec_steps": 4}))
    row = dict(zip(COLUMNS, row_of(log._buffer[0]), strict=True))
    assert row["tokens_per_step"] == pytest.approx(6 / 4) and row["tps_source"] == "engine"


def test_non_streaming_request_has_no_itl() -> None:
    log = RequestLog(Path("unused"))
    log.sink(make_record(steps=()))
    row = dict(zip(COLUMNS, row_of(log._buffer[0]), strict=True))
    assert row["itl_p50_s"] is None and row["decode_tokens_per_s"] is None
    assert row["tokens_per_step"] is None


# --- the request path ---------------------------------------------------------------------------


def test_sink_does_no_io(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    log = RequestLog(path)
    for i in range(10):
        log.sink(make_record(i))
    assert not path.exists()
    assert log.buffered == 10 and log.dropped == 0


def test_sink_drops_and_counts_when_full(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "r.sqlite3", max_buffered=3)
    for i in range(5):
        log.sink(make_record(i))
    assert (log.buffered, log.dropped) == (3, 2)


def test_sink_never_raises() -> None:
    log = RequestLog(Path("unused"))
    log.sink(object())  # type: ignore[arg-type]
    assert log.dropped == 1 and log.buffered == 0


# --- writing ------------------------------------------------------------------------------------


async def test_flush_writes_one_row_per_request(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    log = RequestLog(path)
    for i in range(25):
        log.sink(make_record(i, variant="eagle3" if i % 2 else "base"))
    await log.flush()
    assert (log.written, log.buffered, log.write_errors) == (25, 0, 0)
    got = rows(path)
    assert len(got) == 25
    assert list(got[0]) == list(COLUMNS)  # no prompt, no completion: only these columns
    assert {r["variant"] for r in got} == {"eagle3", "base"}
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        indexes = [r[1] for r in conn.execute("PRAGMA index_list(requests)")]
        assert "requests_time" in indexes
    finally:
        conn.close()
    await log.stop()


async def test_background_batches_and_final_flush(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    log = RequestLog(path, batch_interval_s=0.02)
    await log.start()
    for i in range(5):
        log.sink(make_record(i))
    for _ in range(200):
        if log.written == 5:
            break
        await asyncio.sleep(0.01)
    assert log.written == 5
    log.sink(make_record(99))
    await log.stop()  # the last one is written at shutdown, not lost
    assert log.written == 6 and len(rows(path)) == 6


async def test_a_broken_record_is_dropped_not_the_batch(tmp_path: Path) -> None:
    log = RequestLog(tmp_path / "r.sqlite3")
    bad = make_record(1)
    bad.m.step_tokens.append(1)  # lengths disagree: itl_per_token raises
    log.sink(make_record(0))
    log.sink(bad)
    log.sink(make_record(2))
    await log.flush()
    assert (log.written, log.dropped, log.write_errors) == (2, 1, 0)
    await log.stop()


# --- failures never reach the client ------------------------------------------------------------


async def test_locked_database_is_counted_and_retried(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    open_db(path, 1.0).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
    log = RequestLog(path, busy_timeout_s=0.05)
    try:
        for i in range(3):
            log.sink(make_record(i))
        await log.flush()
        assert (log.written, log.write_errors, log.buffered) == (0, 1, 3)
        log.sink(make_record(3))  # the request path still works meanwhile
        assert log.buffered == 4
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await log.flush()
    assert (log.written, log.buffered, log.dropped) == (4, 0, 0)
    assert [r["request_id"] for r in rows(path)] == ["req-0", "req-1", "req-2", "req-3"]
    await log.stop()


async def test_stop_during_a_stuck_batch(tmp_path: Path) -> None:
    """stop() waits for the batch in flight rather than sharing the connection with it."""
    path = tmp_path / "requests.sqlite3"
    open_db(path, 1.0).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    log = RequestLog(path, batch_interval_s=0.01, busy_timeout_s=0.3)
    log.sink(make_record(0))
    await log.start()
    await asyncio.sleep(0.05)  # the loop is now waiting on the lock in its thread
    holder.execute("ROLLBACK")  # released while stop() waits: the final flush succeeds
    holder.close()
    await log.stop()
    assert log.written == 1 and log.buffered == 0 and len(rows(path)) == 1


async def test_unwritable_location_is_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    log = RequestLog(blocker / "requests.sqlite3")
    log.sink(make_record())
    await log.flush()
    await log.retain()
    assert log.write_errors == 2 and log.buffered == 1 and log.written == 0
    await log.stop()  # the last try fails too, and says so, without raising


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes to read-only directories")
async def test_read_only_directory_is_counted(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        log = RequestLog(ro / "requests.sqlite3")
        log.sink(make_record())
        await log.flush()
        assert log.write_errors == 1 and log.buffered == 1
        await log.stop()
    finally:
        ro.chmod(0o755)


async def test_corrupt_database_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "requests.sqlite3"
    path.write_bytes(b"not a database at all " * 500)
    log = RequestLog(path)
    log.sink(make_record())
    await log.flush()
    assert log.write_errors == 1 and log.buffered == 1
    await log.stop()


class _TinyDisk(RequestLog):
    """A real SQLITE_FULL: the connection may not grow the file past a few pages."""

    def _connection(self) -> sqlite3.Connection:
        conn = super()._connection()
        conn.execute("PRAGMA max_page_count = 8")
        return conn


class _ReadOnly(RequestLog):
    """A real SQLITE_READONLY even as root (who ignores file modes)."""

    def _connection(self) -> sqlite3.Connection:
        conn = super()._connection()
        conn.execute("PRAGMA query_only = ON")
        return conn


async def test_read_only_database_is_counted(tmp_path: Path) -> None:
    log = _ReadOnly(tmp_path / "r.sqlite3")
    log.sink(make_record())
    await log.flush()
    assert log.write_errors == 1 and log.buffered == 1 and log.written == 0
    await log.stop()


async def test_full_disk_keeps_rows_up_to_the_bound(tmp_path: Path) -> None:
    log = _TinyDisk(tmp_path / "r.sqlite3", max_buffered=500)
    for i in range(400):
        log.sink(make_record(i))
    await log.flush()
    assert log.write_errors == 1 and log.written == 0 and log.buffered == 400
    assert rows(tmp_path / "r.sqlite3") == []  # the batch is one transaction: none of it landed
    for i in range(400, 600):
        log.sink(make_record(i))  # the bound holds while the disk stays full
    assert log.buffered == 500 and log.dropped == 100
    await log.flush()
    assert log.write_errors == 2 and log.buffered == 500
    await log.stop()


async def test_errors_are_logged_once_in_a_while(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    log = RequestLog(blocker / "r.sqlite3", error_log_interval_s=3600)
    log.sink(make_record())
    with caplog.at_level(logging.ERROR, logger="proxy.observe.requestlog"):
        for _ in range(5):
            await log.flush()
    assert log.write_errors == 5
    assert len([r for r in caplog.records if "write error" in r.message]) == 1


# --- retention ----------------------------------------------------------------------------------


async def test_retention_by_age(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    log = RequestLog(path, max_age_s=3600)
    now = time.time()
    for i, age in enumerate((7200, 5000, 1800, 10)):
        log.sink(make_record(i, wall=now - age))
    await log.flush()
    await log.retain()
    assert log.deleted == 2
    assert [r["request_id"] for r in rows(path)] == ["req-2", "req-3"]
    await log.stop()


async def test_retention_by_size_keeps_the_newest(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    max_bytes = 128 * 1024
    log = RequestLog(path, max_bytes=max_bytes, max_buffered=10_000)
    now = time.time()
    for i in range(4000):
        log.sink(make_record(i, wall=now - 4000 + i))
    await log.flush()
    wal = path.with_name(path.name + "-wal")
    assert path.stat().st_size + wal.stat().st_size > max_bytes  # the rows sit in the WAL yet
    await log.retain()
    left = rows(path)
    assert 0 < len(left) < 4000 and log.deleted == 4000 - len(left)
    assert left[-1]["request_id"] == "req-3999"  # oldest went first
    assert [r["request_id"] for r in left] == [f"req-{i}" for i in range(4000 - len(left), 4000)]
    assert path.stat().st_size <= max_bytes  # the file shrank, not just its content
    assert not wal.exists() or wal.stat().st_size == 0
    await log.stop()


async def test_retention_runs_from_the_batch_loop(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    log = RequestLog(path, max_age_s=60, batch_interval_s=0.01, retention_interval_s=0.0)
    log.sink(make_record(0, wall=time.time() - 3600))
    await log.start()
    for _ in range(300):
        if log.deleted:
            break
        await asyncio.sleep(0.01)
    await log.stop()
    assert log.written == 1 and log.deleted == 1 and rows(path) == []


def test_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """The benchmark is not a test, but it must keep working: a tiny run of it."""
    from loadtests.bench import requestlog as bench_requestlog

    assert (
        bench_requestlog.main(
            [
                "--calls",
                "300",
                "--rounds",
                "2",
                "--tokens",
                "40",
                "--batch",
                "50",
                "--batches",
                "2",
                "--idle",
                "0.05",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "sink(), 2 rounds x 300 calls" in out and "records/s" in out


def test_session_and_agent_logged_as_hash_and_label() -> None:
    record = make_record(3)
    record.session, record.agent = "s-" + "ab" * 16, "claude-code/subagent"
    log = RequestLog(Path("unused"))
    log.sink(record)
    row = dict(zip(COLUMNS, row_of(log._buffer[0]), strict=True))
    assert (row["session"], row["agent"]) == ("s-" + "ab" * 16, "claude-code/subagent")
    log.sink(make_record(4))  # no session: NULL, not ''
    row = dict(zip(COLUMNS, row_of(log._buffer[1]), strict=True))
    assert (row["session"], row["agent"]) == (None, None)


def test_a_continued_request_names_both_engines() -> None:
    log = RequestLog(Path("unused"))
    record = make_record(variant="shallow")
    record.continued_from = "deep"
    assert record.continued and not make_record(1).continued
    log.sink(record)
    log.sink(make_record(1))
    continued, plain = (dict(zip(COLUMNS, row_of(p), strict=True)) for p in log._buffer)
    assert continued["variant"] == "shallow" and continued["continued_from"] == "deep"
    assert continued["completion_tokens"] == 7  # the whole answer's, both engines'
    assert plain["continued_from"] is None
