"""Run ASGI apps on uvicorn over pre-bound sockets, several in one event loop.

Pre-binding lets `--listen 127.0.0.1:0` pick a free port and print it; sharing one loop lets
the public and admin listeners share the gateway's state. Signals are handled by the caller,
not by each uvicorn server (two servers would otherwise fight over the handlers).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Generator
from typing import Any

import uvicorn


class QuietSignalsServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def make_server(app: Any, *, ssl_context: ssl.SSLContext | None = None,
                graceful_s: int | None = None, **config: Any) -> QuietSignalsServer:
    cfg = uvicorn.Config(app, http="httptools", loop="none", lifespan="off",
                         access_log=False, log_level="warning", server_header=False,
                         date_header=False, timeout_graceful_shutdown=graceful_s,
                         timeout_keep_alive=75, **config)
    cfg.load()
    if ssl_context is not None:
        # Our own context, so SIGHUP can load a renewed certificate into it in place.
        cfg.ssl = ssl_context
    return QuietSignalsServer(cfg)


def url_of(sock: socket.socket, scheme: str) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
