"""A gateway's request log, read back by tests and benchmarks (rows are written in batches)."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any


def logged_rows(
    state_dir: Path, ids: set[str], columns: str = "*", timeout: float = 10.0
) -> dict[str, dict[str, Any]]:
    """The rows of `ids` (by request id), once all are written or `timeout` passed."""
    deadline = time.monotonic() + timeout
    while True:
        conn = sqlite3.connect(state_dir / "requests.sqlite3")
        conn.row_factory = sqlite3.Row
        try:
            rows = {
                r["request_id"]: dict(r)
                for r in conn.execute(f"SELECT request_id, {columns} FROM requests")
                if r["request_id"] in ids
            }
        except sqlite3.OperationalError:  # the gateway has not created its table yet
            rows = {}
        finally:
            conn.close()
        if len(rows) == len(ids) or time.monotonic() > deadline:
            return rows
        time.sleep(0.2)
