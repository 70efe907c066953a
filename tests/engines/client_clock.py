"""The client's clock for the engine tests: a chat stream sent over a raw TLS socket, the time
each body byte came off the socket read at once (an SDK's own parsing would add milliseconds)."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import httptools

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.rawhttp import Address


class Arrivals:
    """httptools callbacks: the body, and when each of its bytes came off the socket."""

    def __init__(self) -> None:
        self.body = bytearray()
        self.marks: list[tuple[int, float]] = []  # (body length after a read, its clock)
        self.now = 0.0
        self.complete = False

    def on_body(self, data: bytes) -> None:
        self.body += data
        self.marks.append((len(self.body), self.now))

    def on_message_complete(self) -> None:
        self.complete = True

    def at(self, offset: int) -> float:
        """When the body byte at `offset` arrived."""
        return next(t for end, t in self.marks if end > offset)


def raw_stream(gw: GatewayServer, body: dict[str, Any], rid: str) -> tuple[float, Arrivals]:
    """(when the request was sent, the reply with its arrival times): the TLS handshake is done
    before the clock starts."""
    target = Address.of(gw.base, gw.certs.ca_cert)
    request = target.request(
        "/v1/chat/completions",
        json.dumps(body).encode(),
        CLIENT_KEY,
        headers=[("x-request-id", rid)],
    )
    reply = Arrivals()
    parser = httptools.HttpResponseParser(reply)
    with socket.create_connection((target.host, target.port)) as raw:
        assert target.tls is not None
        with target.tls.wrap_socket(raw, server_hostname=target.host) as sock:
            t0 = time.perf_counter()
            sock.sendall(request)
            while not reply.complete:
                data = sock.recv(65536)
                reply.now = time.perf_counter()
                if not data:
                    break
                parser.feed_data(data)
    return t0, reply
