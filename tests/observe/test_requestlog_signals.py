"""The agents' signals and a turn's lost prefix in the request log: one column each, NULL when
not sent, an older file migrated on open (its rows kept, their signals NULL), and `specrouter
report --by` on them."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from policies.agent_signals import signals_of
from proxy.backends.prefix import PrefixLoss
from proxy.observe.requestlog import RequestLog, row_of
from proxy.observe.requestlog_schema import COLUMNS, SCHEMA_VERSION
from proxy.ops import report
from tests.observe.test_requestlog import make_record

CLAUDE = {
    b"x-claude-code-request-class": b"compaction",
    b"x-claude-code-agent-type": b"general-purpose",
    b"x-claude-code-compaction": b"auto",
    b"x-claude-code-context-compacted": b"1",
    b"x-claude-code-prev-tool-durations": b"1200,35",
    b"x-claude-code-prompt-id": b"prompt-7",
}
NEW = (
    "request_class",
    "agent_type",
    "compaction",
    "context_compacted",
    "prev_tool_durations",
    "prompt_id",
    "turn_id",
    "turn_state",
)


def test_signals_logged_bounded_and_null_when_absent() -> None:
    log = RequestLog(Path("unused"))
    record = make_record(1)
    record.signals, record.turn_state = signals_of("agent", CLAUDE), "valid"
    log.sink(record)
    log.sink(make_record(2))
    row, plain = (dict(zip(COLUMNS, row_of(p), strict=True)) for p in log._buffer)
    assert {k: row[k] for k in NEW[:5]} == {
        "request_class": "compaction",
        "agent_type": "general-purpose",
        "compaction": "auto",
        "context_compacted": 1,
        "prev_tool_durations": "1200,35",
    }
    assert row["prompt_id"].startswith("p-") and "prompt-7" not in row["prompt_id"]
    assert (row["turn_id"], row["turn_state"]) == (None, "valid")
    assert all(plain[k] is None for k in NEW)


# Version 4's table, as a gateway before this change wrote it.
V4_COLUMNS = COLUMNS[: COLUMNS.index("continued_from") + 1]


def test_an_older_file_is_migrated_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "requests.sqlite3"
    old = sqlite3.connect(path)
    old.execute(f"CREATE TABLE requests ({', '.join(V4_COLUMNS)})")
    old.execute("PRAGMA user_version = 4")
    snap = RequestLog(Path("unused"))
    snap.sink(make_record(0))
    values = dict(zip(COLUMNS, row_of(snap._buffer[0]), strict=True))
    old.execute(
        f"INSERT INTO requests VALUES ({', '.join('?' * len(V4_COLUMNS))})",
        [values[c] for c in V4_COLUMNS],
    )
    old.commit()
    old.close()

    async def write() -> None:
        log = RequestLog(path)
        for i in range(3):
            record = make_record(i + 1)
            record.signals = signals_of("agent", CLAUDE if i else {b"x-openai-subagent": b"review"})
            log.sink(record)
        await log.stop()

    asyncio.run(write())
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    rows = conn.execute("SELECT request_class, agent_type FROM requests ORDER BY time").fetchall()
    conn.close()
    assert sorted(rows, key=str) == sorted(
        [(None, None), ("subagent", "review"), *[("compaction", "general-purpose")] * 2], key=str
    )
    assert (
        report.main(["--db", str(path), "--since", "all", "--by", "request_class,agent_type"]) == 0
    )
    out = capsys.readouterr().out
    lines = out.splitlines()
    groups = lines[lines.index("groups (largest first: the first is the reference)") + 1 :][:3]
    assert [g.split()[:3] for g in groups] == [
        ["request_class=compaction", "agent_type=general-purpose", "2"],
        ["request_class=(none)", "agent_type=(none)", "1"],
        ["request_class=subagent", "agent_type=review", "1"],
    ]
    for key in ("context_compacted", "prompt_id", "turn_id", "turn_state", "compaction"):
        assert report.main(["--db", str(path), "--since", "all", "--by", key, "--json"]) == 0
    assert '"context_compacted": "compacted"' in capsys.readouterr().out


def test_lost_prefix_logged_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A session turn's lost prefix (proxy/backends/prefix.py): four columns, NULL for a request
    not accounted; `specrouter report` sums them per group, by cause."""
    path = tmp_path / "requests.sqlite3"

    async def write() -> None:
        log = RequestLog(path)
        for i, loss in enumerate(
            (
                PrefixLoss(992, 0, ""),
                PrefixLoss(992, 480, "unknown"),
                PrefixLoss(192, 800, "client-rewrite", "system"),
                None,
            )
        ):
            record = make_record(i + 1)
            record.session, record.agent = "s-1", "claude-code"
            if loss is not None:
                record.prefix = loss
            log.sink(record)
        await log.stop()

    asyncio.run(write())
    conn = sqlite3.connect(path)
    rows = conn.execute(
        "SELECT expected_tokens, lost_tokens, loss_cause, loss_where FROM requests ORDER BY time"
    ).fetchall()
    conn.close()
    assert rows == [
        (992, 0, None, None),
        (992, 480, "unknown", None),
        (192, 800, "client-rewrite", "system"),
        (None, None, None, None),
    ]
    assert report.main(["--db", str(path), "--since", "all", "--by", "session"]) == 0
    out = capsys.readouterr().out
    line = out.splitlines()[out.splitlines().index(PREFIX_TITLE) + 1]
    assert line.split() == [
        "session=s-1", "3", "turns", "2,176", "expected", "1,280", "lost",
        "client-rewrite", "800,", "unknown", "480",
    ]  # fmt: skip
    assert report.main(["--db", str(path), "--since", "all", "--by", "loss_cause", "--json"]) == 0
    assert '"lost_client-rewrite": 800' in capsys.readouterr().out


PREFIX_TITLE = "prefix cache: session turns, tokens they should have found, lost (by cause)"
