"""A free loopback port: bound by the OS, then released for the server (or, with nothing
started on it, a port where nothing listens)."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
