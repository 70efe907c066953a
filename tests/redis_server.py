"""A real redis-server for the tests of what replicas share (`make test` installs it)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def redis_server(port: int, workdir: Path) -> Iterator[str]:
    """redis-server on loopback `port` (no persistence), its URL once it accepts; stopped on
    exit. The same port again is a Redis back after an outage."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server missing: `make test` installs it (scripts/system-deps.sh)")
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        [binary, *args, "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
