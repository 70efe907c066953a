"""Slow or oversized clients are cut by the gateway, over real TLS connections."""

from __future__ import annotations

import socket
import ssl
import time

import orjson
import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer


@pytest.fixture(scope="module")
def gw(certs):
    with (
        SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim,
        GatewayServer(
            coder_policy({"a": sim.url}),
            certs=certs,
            args=("--header-timeout", "1", "--body-timeout", "1"),
        ) as gw,
    ):
        yield gw


def _tls(gw: GatewayServer) -> ssl.SSLSocket:
    host, port = gw.base.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    raw = socket.create_connection((host, int(port)), timeout=10)
    return ctx.wrap_socket(raw, server_hostname="localhost")


def _read_all(sock: ssl.SSLSocket) -> bytes:
    out = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, ssl.SSLError):
            break
        if not chunk:
            break
        out += chunk
    return out


def test_slow_headers_are_cut(gw) -> None:
    with _tls(gw) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
        start = time.monotonic()
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - start < 8


def test_idle_connection_without_a_request_is_cut(gw) -> None:
    with _tls(gw) as s:
        assert _read_all(s).startswith(b"HTTP/1.1 408")


def test_slow_body_is_cut_with_an_openai_error(gw) -> None:
    with _tls(gw) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
            b"authorization: Bearer " + CLIENT_KEY.encode() + b"\r\n"
            b'content-type: application/json\r\ncontent-length: 100\r\n\r\n{"mod'
        )
        reply = _read_all(s)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408")
    error = orjson.loads(body[body.index(b"{") : body.rindex(b"}") + 1])["error"]  # chunked
    assert error["type"] == "RequestTimeout" and error["code"] == 408
    assert "body not received" in error["message"]


def test_huge_headers_get_431(gw) -> None:
    with _tls(gw) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 100_000 + b"\r\n\r\n")
        reply = _read_all(s)
    assert reply.startswith(b"HTTP/1.1 431")


def _second_request(s: ssl.SSLSocket, head: bytes) -> bytes:
    """`head` sent as the second request of a kept-alive connection; what comes back for it."""
    s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
    first = b""
    while b'{"status":"ok"}' not in first:
        first += s.recv(65536)
    s.sendall(head)
    return _read_all(s)


def test_a_kept_alive_connections_next_slow_head_is_cut(gw) -> None:
    """The head timer starts when a head does not end in the read it began in: a second
    request's slow head is cut like a first one's, and a huge one gets its 431."""
    with _tls(gw) as s:
        start = time.monotonic()
        reply = _second_request(s, b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
    assert reply.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - start < 8
    with _tls(gw) as s:
        reply = _second_request(
            s, b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-pad: " + b"a" * 100_000 + b"\r\n\r\n"
        )
    assert reply.startswith(b"HTTP/1.1 431")


def test_keep_alive_requests_still_work(gw) -> None:
    with gw.client() as c:
        for _ in range(3):
            assert c.get("/healthz").status_code == 200
            time.sleep(0.6)  # idle between requests is not a slow header
