"""Client-input attacks found on loopback, replayed through the real gateway over TLS
with raw requests: each gets its answer, and nothing else changed: the policy version, another
client's answer, the engine's queue (running and waiting back to 0), the descriptors held."""

from __future__ import annotations

import asyncio
import os
import re
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from loadtests.harness.gateway import (
    ADMIN_TOKEN,
    CLIENT_KEY,
    OTHER_KEY,
    GatewayServer,
    coder_policy,
)
from loadtests.harness.procfs import fd_count
from loadtests.harness.rawhttp import Address, Conn, Reply
from loadtests.harness.sim import SimServer
from proxy.auth import hash_key

CHAT = "/v1/chat/completions"
UNICODE_KEY = "sk-ключ-ü-1"  # a key a client sends as UTF-8
HELLO = [{"role": "user", "content": "hello"}]
ENV = {
    "SPECROUTER_KEEP_ALIVE_UNAUTHENTICATED_S": "1",
    "SPECROUTER_TLS_HANDSHAKE_TIMEOUT_S": "1",
    "SPECROUTER_MAX_CONNECTIONS": "40",
}


@dataclass
class Stack:
    gw: GatewayServer
    sim: SimServer
    target: Address
    fds: int


@pytest.fixture(scope="module")
def stack(certs) -> Iterator[Stack]:
    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)  # inherited by the gateway
    try:
        with SimServer("mtp3", served_model_name="qwen3.8-27b", time_scale=0.02) as sim:
            unicode_client = {"name": "unicode", "key_sha256": hash_key(UNICODE_KEY)}
            policy = coder_policy({"a": sim.url}, extra_clients=[unicode_client])
            policy["routes"]["coder"]["clamps"] = {"max_tokens": {"max": 256}}
            with GatewayServer(policy, certs=certs) as gw:
                target = Address.of(gw.base, certs.ca_cert)
                _chat(gw)  # warm: the engine connection pool exists before the baseline
                assert gw.proc is not None
                yield Stack(gw, sim, target, fd_count(gw.proc.pid))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _chat(gw: GatewayServer, key: str = OTHER_KEY, **body: Any) -> httpx.Response:
    with gw.client(key) as c:
        return c.post(
            "/v1/chat/completions",
            json={"model": "coder", "messages": HELLO, "max_tokens": 8, **body},
        )


def _version(gw: GatewayServer) -> str:
    return str(gw.admin_get("/admin/policy").headers["etag"])


def _engine_idle(sim: SimServer) -> bool:
    text = httpx.get(f"{sim.url}/metrics", timeout=5).text
    values = re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", text, re.M)
    return bool(values) and all(float(v) == 0 for v in values)


def _nothing_else_changed(s: Stack, version: str) -> None:
    assert _version(s.gw) == version
    assert _chat(s.gw).status_code == 200  # another client is served
    deadline = time.monotonic() + 5
    while not _engine_idle(s.sim):
        assert time.monotonic() < deadline, "the engine kept work from the attack"
        time.sleep(0.05)
    assert s.gw.proc is not None and fd_count(s.gw.proc.pid) <= s.fds + 16


def _raw(s: Stack, request: bytes) -> Reply:
    async def go() -> Reply:
        conn = await Conn.open(s.target)
        try:
            async with asyncio.timeout(20):
                return await conn.exchange(request)
        finally:
            await conn.close()

    return asyncio.run(go())


def _post(
    body: Any,
    *,
    path: str = CHAT,
    key: str | None = CLIENT_KEY,
    headers: tuple[tuple[str, str], ...] = (),
) -> Callable[[Address], bytes]:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    return lambda t: t.request(path, raw, key, headers=headers)


def _head(lines: list[str], body: bytes = b"") -> Callable[[Address], bytes]:
    """A request written out whole: `{host}` is the target's."""
    return lambda t: (
        ("\r\n".join(lines).replace("{host}", f"{t.host}:{t.port}") + "\r\n\r\n").encode() + body
    )


def _chunked(trailers: list[str], key: str | None) -> Callable[[Address], bytes]:
    body = orjson.dumps({"model": "coder", "messages": HELLO, "max_tokens": 8})
    auth = [] if key is None else [f"authorization: Bearer {key}"]
    return _head(
        [
            "POST /v1/chat/completions HTTP/1.1",
            "host: {host}",
            "content-type: application/json",
            "transfer-encoding: chunked",
            *auth,
        ],
        b"%x\r\n%b\r\n0\r\n%b\r\n"
        % (len(body), body, "".join(t + "\r\n" for t in trailers).encode()),
    )


def _deep(levels: int) -> bytes:
    return b'{"model":"coder","messages":[],"metadata":' + b"[" * levels + b"]" * levels + b"}"


CHAT_BODY = {"model": "coder", "messages": HELLO, "max_tokens": 8}


def _utf8_key(key: str) -> Callable[[Address], bytes]:
    body = orjson.dumps(CHAT_BODY)
    return _head(
        [
            "POST /v1/chat/completions HTTP/1.1",
            "host: {host}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            f"authorization: Bearer {key}",  # sent as UTF-8 (`_head` encodes so)
        ],
        body,
    )


def _te_and_length(path: str) -> Callable[[Address], bytes]:
    """Both framings at once: the parser itself refuses it, below the app."""
    return _head(
        [
            f"POST {path} HTTP/1.1",
            "host: {host}",
            f"authorization: Bearer {CLIENT_KEY}",
            "transfer-encoding: chunked",
            "content-length: 7",
        ],
        b"2\r\n{}\r\n0\r\n\r\n",
    )


# name: (the request, its status, a piece of its body or None)
ATTACKS: dict[str, tuple[Callable[[Address], bytes], int, str | None]] = {
    "n-unbounded": (_post({**CHAT_BODY, "n": 1_000_000}), 400, '"param":"n"'),
    "best-of-unbounded": (_post({**CHAT_BODY, "best_of": 9}), 400, '"param":"best_of"'),
    "top-logprobs": (_post({**CHAT_BODY, "top_logprobs": 21}), 400, '"param":"top_logprobs"'),
    "completions-logprobs": (
        _post({"model": "coder", "prompt": "x", "logprobs": 6}, path="/v1/completions"),
        400,
        '"param":"logprobs"',
    ),
    "too-many-messages": (
        _post({**CHAT_BODY, "messages": HELLO * 4097}),
        400,
        '"param":"messages"',
    ),
    "string-max-tokens": (_post({**CHAT_BODY, "max_tokens": "600"}), 400, '"param":"max_tokens"'),
    "string-temperature": (
        _post({**CHAT_BODY, "temperature": "0.1"}),
        400,
        '"param":"temperature"',
    ),
    "string-stream": (_post({**CHAT_BODY, "stream": "true"}), 400, '"param":"stream"'),
    "json-depth-300": (_post(_deep(300)), 400, "nested deeper than 128"),
    "json-depth-1000": (_post(_deep(1000)), 400, "nested deeper than 128"),
    "int-beyond-64-bits": (
        _post(b'{"model":"coder","messages":[],"seed":' + b"9" * 30 + b"}"),
        400,
        '"param":"seed"',
    ),
    "int-beyond-64-bits-nested": (
        _post(b'{"model":"coder","messages":[],"x":{"y":[1' + b"0" * 25 + b"]}}"),
        400,
        "beyond 64 bits",
    ),
    "trailer-authorization": (
        _chunked([f"authorization: Bearer {CLIENT_KEY}"], None),
        401,
        "invalid_api_key",
    ),
    "trailer-variant-pin": (_chunked(["x-specrouter-variant: nosuch"], CLIENT_KEY), 200, None),
    "duplicate-authorization": (
        _post(CHAT_BODY, headers=(("authorization", f"Bearer {OTHER_KEY}"),)),
        400,
        "more than one authorization",
    ),
    "transfer-encoding-identity-chunked": (
        _head(
            [
                "POST /v1/chat/completions HTTP/1.1",
                "host: {host}",
                f"authorization: Bearer {CLIENT_KEY}",
                "transfer-encoding: identity, chunked",
            ],
            b"2\r\n{}\r\n0\r\n\r\n",
        ),
        400,
        "only transfer coding",
    ),
    "upgrade-body-vanishes": (
        _post(CHAT_BODY, headers=(("connection", "upgrade"), ("upgrade", "h2c"))),
        400,
        "upgrades are not supported",
    ),
    # Codex's built-in provider falls back to HTTP at once on a 426 (docs/clients.md).
    "websocket-upgrade": (
        _head(
            [
                "GET /v1/responses HTTP/1.1",
                "host: {host}",
                f"authorization: Bearer {CLIENT_KEY}",
                "connection: Upgrade",
                "upgrade: websocket",
                "sec-websocket-version: 13",
                "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==",
            ]
        ),
        426,
        "`specrouter connect codex` writes a Codex provider",
    ),
    "encoded-slash": (_post(CHAT_BODY, path="/v1/chat%2Fcompletions"), 404, "encoded slash"),
    "encoded-slash-lower": (_post(CHAT_BODY, path="/v1%2fchat/completions"), 404, "encoded slash"),
    # docs/security-hardening.md (Low: input and HTTP)
    "percent-encoded-path": (
        _post(CHAT_BODY, path="/%76%31/chat/completions"),
        404,
        "percent-encoded path",
    ),
    # A reserved character's escape is still routed (and decoded): only needless ones go.
    "percent-encoded-reserved": (
        _head(
            [
                "GET /v1/models/coder%3Ax HTTP/1.1",
                "host: {host}",
                f"authorization: Bearer {CLIENT_KEY}",
            ]
        ),
        404,
        "coder:x",
    ),
    "non-ascii-key": (_utf8_key(UNICODE_KEY), 200, None),
    "bad-transfer-encoding": (_te_and_length(CHAT), 400, '"error":{"message":"invalid HTTP'),
    "bad-transfer-encoding-messages": (
        _te_and_length("/v1/messages"),
        400,
        '{"type":"error","error":{"type":"invalid_request_error"',
    ),
    # The Messages API's own refusals are in its shape too.
    "get-messages": (
        _head(["GET /v1/messages HTTP/1.1", "host: {host}", f"x-api-key: {CLIENT_KEY}"]),
        405,
        '{"type":"error","error":{"type":"invalid_request_error"',
    ),
    "messages-unknown-path": (
        _head(["GET /v1/messages/batches HTTP/1.1", "host: {host}", f"x-api-key: {CLIENT_KEY}"]),
        404,
        '{"type":"error","error":{"type":"not_found_error"',
    ),
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack(stack: Stack, name: str) -> None:
    build, status, piece = ATTACKS[name]
    version = _version(stack.gw)
    reply = _raw(stack, build(stack.target))
    assert reply.status == status, bytes(reply.body)[:300]
    if piece is not None:
        assert piece in reply.body.decode("utf-8", "replace")
    _nothing_else_changed(stack, version)


def test_a_websocket_upgrade_is_answered_426_and_closed(stack: Stack) -> None:
    build, _, _ = ATTACKS["websocket-upgrade"]
    reply = _raw(stack, build(stack.target))
    assert reply.status == 426 and reply.headers["connection"] == "close"
    error = orjson.loads(bytes(reply.body))["error"]
    assert "HTTP (server-sent events)" in error["message"] and error["code"] == 426


def test_clamp_holds_under_every_name(stack: Stack) -> None:
    version = _version(stack.gw)
    for name in ("max_tokens", "max_completion_tokens"):
        reply = _chat(stack.gw, CLIENT_KEY, **{"max_tokens": None, name: 600})
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] <= 256
    _nothing_else_changed(stack, version)


@pytest.mark.parametrize(
    ("sent", "kept"), [("x" * 60_000, False), ("a b", False), ("trace-1:2.3_ok", True)]
)
def test_request_id_bounded(stack: Stack, sent: str, kept: bool) -> None:
    reply = _raw(stack, _post(CHAT_BODY, headers=(("x-request-id", sent),))(stack.target))
    assert reply.status == 200
    got = reply.headers["x-request-id"]
    assert (got == sent) is kept and len(got) <= 128
    assert re.fullmatch(r"[A-Za-z0-9._:-]+", got)


@pytest.mark.parametrize("body", [b"true", b"1.9", b"9" * 300, b'"1"'])
def test_rollback_takes_only_a_version_number(stack: Stack, body: bytes) -> None:
    version = _version(stack.gw)
    reply = httpx.post(
        stack.gw.admin + "/admin/policy/rollback",
        content=b'{"version": %b}' % body,
        timeout=10,
        headers={"authorization": f"Bearer {ADMIN_TOKEN}", "if-match": version},
    )
    assert reply.status_code == 400, reply.text
    _nothing_else_changed(stack, version)


def test_connections_that_never_start_tls_are_cut_and_capped(stack: Stack) -> None:
    version = _version(stack.gw)
    silent = [
        socket.create_connection((stack.target.host, stack.target.port)) for _ in range(60)
    ]  # more than max_connections (40)
    try:
        time.sleep(0.3)
        assert stack.gw.proc is not None
        # Past the cap, a connection that completes TLS is refused at once, and it is logged;
        # the 503 says when to retry, as the gateway's other refusals do.
        full = _chat(stack.gw)
        assert full.status_code == 503
        assert full.headers["retry-after"] == "1" and full.headers["x-should-retry"] == "true"
        # The gateway's stderr is read by a thread: the line may land just after the 503.
        deadline = time.monotonic() + 5
        while not any("connection limit reached" in line for line in stack.gw.output):
            assert time.monotonic() < deadline, "the connection limit was not logged"
            time.sleep(0.05)
        # The handshake deadline (1 s here, 10 s by default) cuts them all.
        for sock in silent:
            sock.settimeout(5)
            assert sock.recv(1) == b""
    finally:
        for sock in silent:
            sock.close()
    # The count forgets a connection that never made its handshake just after the deadline.
    deadline = time.monotonic() + 5
    while _chat(stack.gw).status_code == 503:
        assert time.monotonic() < deadline, "the cap still counts connections that are gone"
        time.sleep(0.2)
    _nothing_else_changed(stack, version)


def test_plain_http_on_the_tls_port_is_told_to_use_https(stack: Stack) -> None:
    """A 400 that says https, in the path's API shape, where TLS alone gives an empty reply."""
    version = _version(stack.gw)
    for path, anthropic in ((CHAT, False), ("/v1/messages", True)):
        body = orjson.dumps({"model": "coder", "messages": HELLO})
        with socket.create_connection((stack.target.host, stack.target.port), timeout=5) as sock:
            sock.sendall(
                b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%b" % (path.encode(), len(body), body)
            )
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
        head, _, answer = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), reply
        error = orjson.loads(answer)
        assert "use https://" in error["error"]["message"]
        assert (error.get("type") == "error") is anthropic, error
    _nothing_else_changed(stack, version)


def test_idle_keep_alive_is_short_until_authenticated(stack: Stack) -> None:
    async def idle_after(key: str | None) -> bool:
        conn = await Conn.open(stack.target)
        try:
            reply = await conn.exchange(stack.target.request(CHAT, orjson.dumps(CHAT_BODY), key))
            assert reply.status == (200 if key else 401)
            await asyncio.sleep(2.5)  # past the unauthenticated keep-alive (1 s here)
            try:
                async with asyncio.timeout(0.2):
                    return await conn.reader.read(1) != b""
            except TimeoutError:
                return True  # still open
        finally:
            await conn.close()

    assert asyncio.run(idle_after(None)) is False
    assert asyncio.run(idle_after(CLIENT_KEY)) is True


def test_a_pipelined_head_in_the_same_read_is_held_to_the_limit(stack: Stack) -> None:
    """The second request's 100 KB head arrives with the first request, in one write: it is
    refused (431) as it is when it arrives alone (the limit is 64 KiB)."""
    first = stack.target.request(CHAT, orjson.dumps(CHAT_BODY), OTHER_KEY)
    pad = tuple((f"x-pad-{i}", "p" * 4000) for i in range(25))
    second = stack.target.request(CHAT, orjson.dumps(CHAT_BODY), OTHER_KEY, headers=pad)

    async def go() -> bytes:
        conn = await Conn.open(stack.target)
        try:
            conn.writer.write(first + second)
            got = b""
            async with asyncio.timeout(20):
                while chunk := await conn.reader.read(65536):
                    got += chunk
            return got
        finally:
            await conn.close()

    version = _version(stack.gw)
    got = asyncio.run(go())
    # The connection ends with the refusal (the first request's answer, not yet written
    # when the read is parsed, goes with it, as with any malformed pipelined request).
    assert b"HTTP/1.1 431" in got and b"request headers larger than" in got, got[-300:]
    assert got.count(b"HTTP/1.1 200") <= 1
    _nothing_else_changed(stack, version)
