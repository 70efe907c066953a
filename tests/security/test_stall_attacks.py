"""One value, one client or one engine must not cost everyone (docs/security-isolation.md),
replayed against the real gateway over TLS, with a raw engine on loopback
(tests/security/test_engine_attacks.py's, given the scripts below).

- 1: a temperature of 2^63, or an engine claiming 2^63 tokens, once made the request log drop
  its whole batch, other clients' rows included: every other row is written now, the value
  bounded where it came in, and a row SQLite still refuses costs only itself, counted.
- 3: clients that never read their streams held the engine's admission slots for as long as
  their sockets stayed open: a paused stream now ends after `client_write_timeout_s` and the
  engine's work is aborted.
- 4: an engine claiming 30 M tokens made each dashboard snapshot expand a 30 M-element list on
  the event loop: the snapshot's cost no longer follows the tokens claimed.
- 7: idle connections from one address filled `max_connections`: each source now has its own
  cap, and another address is served; so does each network (IPv4 /24, IPv6 /64).
"""

from __future__ import annotations

import asyncio
import os
import socket
import sqlite3
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client import CollectorRegistry, Counter

from loadtests.harness.gateway import (
    ADMIN_TOKEN,
    CLIENT_KEY,
    OTHER_KEY,
    GatewayServer,
    coder_policy,
)
from loadtests.harness.rawhttp import Address
from proxy.certs import CertFiles
from proxy.observe.requestlog import RequestLog
from tests.security.test_engine_attacks import SCRIPTS, RawEngine, _chunk, _json, _sse_head

BIG = 2**63  # an integer JSON (and orjson) reads as an integer, beyond SQLite's
CHAT = "/v1/chat/completions"
ENDED: list[float] = []  # when the endless stream's engine connection was closed by the gateway


def _usage(tokens: int) -> bytes:
    return b'"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}' % (
        tokens,
        tokens,
        tokens,
    )


async def s_huge_usage(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(b'{"id":"c","object":"chat.completion","choices":[],' + _usage(BIG) + b"}"))
    return True


def _frame(content: bytes, tokens: int) -> bytes:
    return _chunk(
        b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":'
        b'{"content":"' + content + b'"},"finish_reason":null}],' + _usage(tokens) + b"}\n\n"
    )


def _claiming(tokens: int) -> Callable[[asyncio.StreamWriter, str], Any]:
    async def script(w: asyncio.StreamWriter, rid: str) -> bool:
        w.write(_sse_head() + _frame(b"a", 1))
        await w.drain()
        await asyncio.sleep(0.02)
        w.write(_frame(b"b", tokens) + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True

    return script


async def s_endless(w: asyncio.StreamWriter, rid: str) -> bool:
    """16 KB events until the gateway stops reading (then TCP pushes back here) and closes the
    connection; at most 64 MB."""
    frame = _frame(b"x" * 16_000, 1)
    try:
        w.write(_sse_head())
        for _ in range(4_000):
            w.write(frame)
            await w.drain()
    except ConnectionError:
        ENDED.append(time.monotonic())
    return False


SCRIPTS.update(
    huge_usage=s_huge_usage,
    claims_30m=_claiming(30_000_000),
    claims_2p63=_claiming(BIG),
    endless=s_endless,
)

ENV = {"SPECROUTER_CLIENT_WRITE_TIMEOUT_S": "1"}


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)  # inherited by the gateway
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[tuple[GatewayServer, RawEngine]]:
    with RawEngine() as engine, _env(ENV):
        policy = coder_policy({"raw": engine.url}, defaults={})
        policy["backends"]["raw"]["max_concurrency"] = 2  # two admission slots
        with GatewayServer(policy, certs=certs, args=("--idle-timeout", "5")) as gw:
            yield gw, engine


def _body(script: str) -> dict[str, Any]:
    return {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "hostile": script}


def _post(c: httpx.Client, script: str, **extra: Any) -> httpx.Response:
    return c.post(CHAT, json={**_body(script), **extra})


def _rows(gw: GatewayServer, sql: str) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(gw.dir / "state" / "requests.sqlite3", timeout=5)
    try:
        return db.execute(sql).fetchall()
    except sqlite3.OperationalError:  # no table before the first batch
        return []
    finally:
        db.close()


def _others_logged(gw: GatewayServer) -> int:
    rows = _rows(gw, "SELECT count(*) FROM requests WHERE client = 'other'")
    return int(rows[0][0]) if rows else 0


# -- 1: one value never costs another row ----------------------------------------------------------

# (attack, the extra fields, the attacker's row as written: (temperature, prompt, completion))
VALUES = [
    ("temperature_2p63", "ok", {"temperature": BIG}, (float(BIG), None, 0)),
    ("engine_tokens_2p63", "huge_usage", {}, (None, None, 0)),
    ("engine_stream_2p63", "claims_2p63", {"stream": True}, (None, 1, 1)),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("attack", "script", "extra", "row"), VALUES, ids=[v[0] for v in VALUES])
def test_one_value_never_costs_other_rows(
    stack: tuple[GatewayServer, RawEngine],
    attack: str,
    script: str,
    extra: dict[str, Any],
    row: tuple[Any, ...],
) -> None:
    gw, _ = stack
    before = _others_logged(gw)
    results: list[int] = []

    def other() -> None:
        with gw.client(OTHER_KEY) as c:
            results.extend(_post(c, "ok").status_code for _ in range(10))

    workers = [threading.Thread(target=other) for _ in range(4)]  # 40 rows of another client
    for t in workers:
        t.start()
    with gw.client(CLIENT_KEY) as c:
        r = _post(c, script, **extra)
        assert r.status_code == 200, r.text[:300]
        rid = r.headers["x-request-id"]
    for t in workers:
        t.join(30)
    assert results == [200] * 40
    deadline = time.monotonic() + 10  # the log writes every 0.5 s
    while _others_logged(gw) < before + 40 or not _rows(
        gw, f"SELECT 1 FROM requests WHERE request_id = '{rid}'"
    ):
        assert time.monotonic() < deadline, (attack, _others_logged(gw) - before)
        time.sleep(0.2)
    got = _rows(
        gw,
        "SELECT temperature, prompt_tokens, completion_tokens FROM requests "
        f"WHERE request_id = '{rid}'",
    )
    assert got == [row]


def test_a_row_sqlite_refuses_costs_only_itself(tmp_path: Path) -> None:
    """Below the edge's bounds, the log's own: rows that cannot be stored are dropped one by
    one and counted; the rest of their batch is written."""
    from proxy.gateway import RequestRecord
    from proxy.record.measure import Measurement

    counter = Counter("dropped", "d", ("reason",), registry=CollectorRegistry())
    log = RequestLog(tmp_path / "r.sqlite3", dropped_counter=counter)

    def record(n: int, conc: int = 1) -> RequestRecord:
        r = RequestRecord(f"r{n}", "c", "chat", route="coder", m=Measurement(0.0))
        r.concurrency = conc
        return r

    async def go() -> None:
        for n in range(40):
            log.sink(record(n))
        log.sink(record(99, conc=BIG))  # as no edge would let through
        bad = record(98)
        bad.client = "\ud800"  # not UTF-8: refused by SQLite at the insert itself
        log.sink(bad)
        await log.flush()
        await log.stop()

    asyncio.run(go())
    assert log.written == 40 and log.dropped == 2
    assert counter.labels("unstorable")._value.get() == 2
    db = sqlite3.connect(tmp_path / "r.sqlite3")
    assert db.execute("SELECT count(*) FROM requests").fetchone()[0] == 40
    db.close()


# -- 4: the dashboard's cost does not follow the tokens an engine claims ---------------------------


@pytest.mark.timeout(60)
def test_claimed_tokens_do_not_stall_the_dashboard(stack: tuple[GatewayServer, RawEngine]) -> None:
    gw, _ = stack
    with gw.client(CLIENT_KEY) as c:
        for script in ("claims_30m", "claims_30m", "claims_2p63"):
            with c.stream("POST", CHAT, json={**_body(script), "stream": True}) as r:
                assert r.status_code == 200 and r.read().endswith(b"data: [DONE]\n\n")
    auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
    for _ in range(3):
        started = time.monotonic()
        snap = httpx.get(gw.admin + "/dashboard/snapshot", headers=auth, timeout=30)
        took = time.monotonic() - started
        assert snap.status_code == 200, snap.text[:300]
        assert took < 1.5, f"snapshot took {took:.2f}s"  # 2.3 s each with one 30 M claim
        rows = [r for r in snap.json()["recent"] if r["client"] == "agent"]
        assert any(r["tokens"] == 30_000_000 for r in rows)  # counted, never expanded
        assert all(r["tokens"] < 2**31 for r in rows)  # 2^63: not a count
    with gw.client() as c:
        assert c.get("/healthz").status_code == 200


# -- 3: a client that never reads does not keep the engine's slot -----------------------------------


def _stalled_stream(gw: GatewayServer) -> ssl.SSLSocket:
    """A stream requested by a client that then reads nothing (a 4 KB receive buffer)."""
    target = Address.of(gw.base, gw.certs.ca_cert)
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect((target.host, target.port))
    assert target.tls is not None
    tls = target.tls.wrap_socket(raw, server_hostname=target.host)
    tls.sendall(target.request(CHAT, orjson.dumps({**_body("endless"), "stream": True}), OTHER_KEY))
    return tls


def _slots_come_back(gw: GatewayServer) -> None:
    ENDED.clear()
    stalled = [_stalled_stream(gw) for _ in range(2)]  # both of the backend's slots
    try:
        deadline = time.monotonic() + 20  # the gateway pauses once the buffers are full,
        while len(ENDED) < 2:  # then ends each stream 1 s later (client_write_timeout_s)
            assert time.monotonic() < deadline, f"{len(ENDED)} of 2 engine streams ended"
            time.sleep(0.1)
        with gw.client(CLIENT_KEY) as c:
            r = _post(c, "ok")
        assert r.status_code == 200, r.text[:300]  # a slot is free: not 503 "backend busy"
        for tls in stalled:  # the stalled clients' connections were closed by the gateway
            tls.settimeout(5)
            with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
                while tls.recv(1 << 16):
                    pass
                raise ConnectionResetError("closed")
    finally:
        for tls in stalled:
            tls.close()


@pytest.mark.timeout(60)
def test_streams_nobody_reads_give_their_slots_back(
    stack: tuple[GatewayServer, RawEngine],
) -> None:
    _slots_come_back(stack[0])


@pytest.mark.timeout(60)
def test_streams_nobody_reads_give_their_slots_back_on_the_pull_relay(
    stack: tuple[GatewayServer, RawEngine], certs: CertFiles
) -> None:
    """The pull relay: the idle deadline runs out while the send waits for the client (2 s
    here), then the error event waits at most client_write_timeout_s."""
    _, engine = stack
    policy = coder_policy({"raw": engine.url}, defaults={})
    policy["backends"]["raw"]["max_concurrency"] = 2
    args = ("--relay", "pull", "--idle-timeout", "2")
    with _env(ENV), GatewayServer(policy, certs=certs, args=args) as gw:
        _slots_come_back(gw)


# -- 7: one source address, or one network, cannot fill max_connections ---------------------------

CAP_ENV = {
    "SPECROUTER_MAX_CONNECTIONS": "40",
    "SPECROUTER_MAX_CONNECTIONS_PER_SOURCE": "10",
    "SPECROUTER_MAX_CONNECTIONS_PER_NETWORK": "25",
}
ATTACKER = "127.0.5.2"  # loopback: another source address on the same host, another /24
NEIGHBOURS = ("127.0.5.3", "127.0.5.4")  # more addresses of the attacker's /24


def _held(sources: tuple[str, ...], target: Address, each: int) -> tuple[list[socket.socket], int]:
    """`each` idle connections (never a TLS handshake) from each source, and how many of them
    the gateway closed at once."""
    idle = []
    for source in sources:
        for _ in range(each):
            s = socket.socket()
            s.bind((source, 0))
            s.connect((target.host, target.port))
            idle.append(s)
    time.sleep(0.3)
    closed = 0
    for s in idle:
        s.settimeout(0.05)
        try:
            closed += s.recv(1) == b""
        except TimeoutError:
            pass
        except ConnectionError:
            closed += 1
    return idle, closed


@pytest.mark.timeout(60)
def test_one_source_or_network_cannot_fill_the_connection_budget(
    stack: tuple[GatewayServer, RawEngine], certs: CertFiles
) -> None:
    _, engine = stack
    with _env(CAP_ENV), GatewayServer(coder_policy({"raw": engine.url}), certs=certs) as gw:
        target = Address.of(gw.base, certs.ca_cert)
        idle, closed = _held((ATTACKER,), target, 60)  # more than max_connections (40)
        try:
            assert closed == 50, closed  # past its 10, the source's connections are closed
            assert any("connection limit per source" in line for line in gw.output)
            # Two more addresses of its /24, 15 each: the network stops at 25 (10 + 10 + 5).
            more, closed = _held(NEIGHBOURS, target, 15)
            idle += more
            assert closed == 15, closed
            assert any("connection limit per network" in line for line in gw.output)
            with gw.client() as c:  # another address: served at once, not 503
                assert _post(c, "ok").status_code == 200
        finally:
            for s in idle:
                s.close()
        # Its places come back as its connections close: the address is served again.
        transport = httpx.HTTPTransport(
            local_address=ATTACKER, verify=ssl.create_default_context(cafile=certs.ca_cert)
        )
        deadline = time.monotonic() + 5
        while True:
            try:
                with gw.client(transport=transport) as c:
                    assert _post(c, "ok").status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "the source's closed connections still count"
                time.sleep(0.1)
