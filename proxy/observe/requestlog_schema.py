"""The request log's SQLite file: its schema, columns and their migration, and opening it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

# 2: tps_source, gateway_s, engine_headers_s; 3: session, agent; 4: continued_from;
# 5: the agents' own signals (request_class ... turn_state); 6: adapted; 7: the lost prefix
SCHEMA_VERSION = 7

# Column order is the order of `requestlog.row_of`'s tuple; `report` reads them by these names.
COLUMNS: tuple[str, ...] = (
    "time",
    "request_id",
    "client",
    "route",
    "variant",
    "reason",
    "canary",
    "content_class",
    "temperature",
    "temperature_defaulted",
    "concurrency",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ttft_s",
    "itl_p50_s",
    "itl_p95_s",
    "tokens_per_step",
    "decode_tokens_per_s",
    "e2e_s",
    "finish_reason",
    "outcome",
    "policy_version",
    "tps_source",
    "gateway_s",
    "engine_headers_s",
    "session",
    "agent",
    "continued_from",
    "request_class",
    "agent_type",
    "compaction",
    "context_compacted",
    "prev_tool_durations",
    "prompt_id",
    "turn_id",
    "turn_state",
    "adapted",
    "expected_tokens",
    "lost_tokens",
    "loss_cause",
    "loss_where",
)
# Columns after version 1's, with their types: an older file gets them on open.
ADDED = (
    ("tps_source", "TEXT"),
    ("gateway_s", "REAL"),
    ("engine_headers_s", "REAL"),
    ("session", "TEXT"),
    ("agent", "TEXT"),
    ("continued_from", "TEXT"),
    ("request_class", "TEXT"),
    ("agent_type", "TEXT"),
    ("compaction", "TEXT"),
    ("context_compacted", "INTEGER"),
    ("prev_tool_durations", "TEXT"),
    ("prompt_id", "TEXT"),
    ("turn_id", "TEXT"),
    ("turn_state", "TEXT"),
    ("adapted", "TEXT"),
    ("expected_tokens", "INTEGER"),
    ("lost_tokens", "INTEGER"),
    ("loss_cause", "TEXT"),
    ("loss_where", "TEXT"),
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    time REAL NOT NULL,             -- unix seconds when the request arrived
    request_id TEXT NOT NULL,
    client TEXT NOT NULL,
    route TEXT NOT NULL,
    variant TEXT NOT NULL,          -- the backend that answered last ('' when rejected)
    reason TEXT NOT NULL,
    canary INTEGER NOT NULL,
    content_class TEXT,
    temperature REAL,               -- effective: the client's or the injected default
    temperature_defaulted INTEGER NOT NULL,
    concurrency INTEGER NOT NULL,   -- open on the backend when it started, itself included
    prompt_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER NOT NULL,
    ttft_s REAL,                    -- streams only (NULL for a non-streaming request)
    itl_p50_s REAL,
    itl_p95_s REAL,
    tokens_per_step REAL,           -- from tps_source
    decode_tokens_per_s REAL,
    e2e_s REAL,
    finish_reason TEXT,
    outcome TEXT NOT NULL,
    policy_version TEXT NOT NULL,
    tps_source TEXT,                -- engine | chunks | average (measure.TpsSource), or NULL
    gateway_s REAL,                 -- arrival to the answering engine asked
    engine_headers_s REAL,          -- the engine asked to its response headers
    session TEXT,                   -- the session key: a hash scoped by client, never content
    agent TEXT,                     -- claude-code, codex, opencode, user, fingerprint (+/subagent)
    continued_from TEXT,            -- the backend that began a stream `variant` finished (or NULL)
    -- the agent's own signals (policies/agent_signals.py), bounded; NULL when not sent
    request_class TEXT,             -- main, subagent, workflow, compaction, auxiliary, other
    agent_type TEXT,                -- Claude Code's agent type or Codex's subagent (32 chars)
    compaction TEXT,                -- Claude Code's compaction header (a short name)
    context_compacted INTEGER,      -- Claude Code: the context was compacted before this
    prev_tool_durations TEXT,       -- Claude Code: at most 16 numbers, comma-separated
    prompt_id TEXT,                 -- the prompt id hashed with the client (p-...)
    turn_id TEXT,                   -- Codex's turn id hashed with the client (t-...)
    turn_state TEXT,                -- x-codex-turn-state: issued, valid or refused
    adapted TEXT,                   -- proxy/relay/adapt.py rules that changed it, comma-separated
    -- a session turn's prefix (proxy/backends/prefix.py); NULL when not accounted
    expected_tokens INTEGER,        -- what it should have found cached (whole blocks)
    lost_tokens INTEGER,            -- of its engine's prefix after the previous turn, not found
    loss_cause TEXT,                -- client-rewrite, compacted, unknown (NULL: nothing lost)
    loss_where TEXT                 -- the first changed field or item, for a client's rewrite
);
CREATE INDEX IF NOT EXISTS requests_time ON requests (time);
"""

INSERT = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


def open_db(path: Path, busy_timeout_s: float) -> sqlite3.Connection:
    """Open (creating if needed) the log database in WAL mode.

    WAL lets `specrouter report` read while the gateway writes; synchronous=NORMAL can lose the
    last batches on power loss, never corrupt the file, which is the right trade for a log.
    auto_vacuum must be set before the first table exists so retention can shrink the file.
    """
    conn = sqlite3.connect(
        path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.executescript(SCHEMA)
        have = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
        for name, kind in ADDED:
            if name not in have:
                conn.execute(f"ALTER TABLE requests ADD COLUMN {name} {kind}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        conn.close()
        raise
    return conn
