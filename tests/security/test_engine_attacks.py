"""Attacks from the engine side and through policy documents, replayed against the real gateway.

A raw engine on loopback answers each POST with the script its body names (`hostile`), on
kept-alive connections as vLLM does. Each attack has its expected answer; after each, another
client's request is answered as before, the policy version is unchanged, and the gateway's
memory and descriptors stay bounded. The policy-document attacks go through the admin API
while another client is being served.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from loadtests.harness.gateway import ADMIN_TOKEN, OTHER_KEY, GatewayServer, coder_policy
from proxy.certs import CertFiles
from tests.security.loopback_engine import LoopbackEngine

AUTH = {"authorization": f"Bearer {ADMIN_TOKEN}"}
MIB = 1 << 20
ANSWER = b'{"id":"cmpl-1","object":"chat.completion","model":"qwen3.8-27b","choices":[]}'
SEEN = ANSWER.replace(b'"qwen3.8-27b"', b'"coder"')  # the client asked for model "coder"
Script = Callable[[asyncio.StreamWriter, str], Awaitable[bool]]  # True: keep the connection


def _json(
    body: bytes,
    *,
    extra: bytes = b"",
    status: bytes = b"200 OK",
    ctype: bytes = b"application/json",
) -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\ncontent-type: "
        + ctype
        + b"\r\ncontent-length: %d\r\n" % len(body)
        + extra
        + b"\r\n"
        + body
    )


def _sse_head(extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n" + extra + b"\r\n"
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


async def s_ok(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(ANSWER))
    return True


async def s_huge_frame(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_sse_head() + _chunk(b'data: {"x":"'))
    piece = _chunk(b"x" * MIB)
    for _ in range(20):  # 20 MiB and no blank line
        w.write(piece)
        await w.drain()
    w.write(_chunk(b'"}\n\n') + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return False


async def s_big_frame(w: asyncio.StreamWriter, rid: str) -> bool:
    """A legitimate large event (a Responses final event, say): under the limit, relayed."""
    w.write(
        _sse_head()
        + _chunk(b'data: {"x":"' + b"y" * (12 * MIB) + b'"}\n\n')
        + _chunk(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )
    return True


async def s_huge_header(w: asyncio.StreamWriter, rid: str) -> bool:
    headers = b"".join(b"x-pad-%d: %b\r\n" % (i, b"p" * 8000) for i in range(25))  # 200 KB
    w.write(_json(ANSWER, extra=headers))
    return False


async def s_headers(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(
        _json(
            ANSWER,
            extra=b"set-cookie: session=stolen\r\nx-specrouter-variant: evil\r\n"
            b"server: engine/1.0\r\nx-internal-host: 10.0.0.7\r\nretry-after: 1\r\n",
        )
    )
    return True


async def s_html_200(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(b"<html>login required</html>", ctype=b"text/html"))
    return True


CR_FRAMES = [
    b'data: {"choices":[{"delta":{"content":"a"}}]}\r\r',
    b'data: {"choices":[{"delta":{"content":"b"}}]}\r\r',
    b"data: [DONE]\r\r",
]


async def s_cr_only(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_sse_head() + b"".join(_chunk(f) for f in CR_FRAMES) + b"0\r\n\r\n")
    return True


async def s_wrong_id(w: asyncio.StreamWriter, rid: str) -> bool:
    w.write(_json(ANSWER, extra=b"x-request-id: someone-else\r\n"))
    return True


EVIL = b'{"id":"cmpl-evil","object":"chat.completion","choices":[]}'


async def s_second_response(w: asyncio.StreamWriter, rid: str) -> bool:
    """The answer, then an answer nobody asked for, in the same write."""
    w.write(
        _json(ANSWER, extra=b"x-request-id: %b\r\n" % rid.encode())
        + _json(EVIL, extra=b"x-request-id: stale\r\n")
    )
    return True


async def s_late_response(w: asyncio.StreamWriter, rid: str) -> bool:
    """The answer, then, while the connection is idle, one nobody asked for."""
    w.write(_json(ANSWER, extra=b"x-request-id: %b\r\n" % rid.encode()))
    await w.drain()
    await asyncio.sleep(0.2)
    w.write(_json(EVIL, extra=b"x-request-id: stale\r\n"))
    return True


SCRIPTS: dict[str, Script] = {
    name.removeprefix("s_"): fn for name, fn in globals().items() if name.startswith("s_")
}


class RawEngine(LoopbackEngine):
    """HTTP/1.1 on loopback, in its own thread: GETs answered like vLLM's /health and
    /metrics, each POST by the script its body names, kept alive when the script says so."""

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], body: bytes
    ) -> bool:
        if line.startswith("GET "):
            w.write(_json(b"", ctype=b"text/plain"))
            return True
        script = SCRIPTS[orjson.loads(body)["hostile"]]
        return await script(w, headers.get("x-request-id", ""))


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[tuple[GatewayServer, RawEngine]]:
    with RawEngine() as engine:
        policy = coder_policy({"raw": engine.url}, defaults={})
        with GatewayServer(
            policy, certs=certs, args=("--first-byte-timeout", "5", "--idle-timeout", "5")
        ) as gw:
            yield gw, engine


def _post(
    gw: GatewayServer, script: str, *, stream: bool = False, key: str | None = None
) -> tuple[int, httpx.Headers, bytes]:
    body = {
        "model": "coder",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        "hostile": script,
    }
    with (
        gw.client(**({} if key is None else {"key": key})) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        return r.status_code, r.headers, r.read()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _wait_ready(gw: GatewayServer) -> None:
    """A failed stream counts against the engine; health checks bring it back in ~0.5 s."""
    deadline = time.monotonic() + 10
    with gw.client() as c:
        while c.get("/readyz").status_code != 200:
            assert time.monotonic() < deadline, "engine never came back up"
            time.sleep(0.1)


def _version(gw: GatewayServer) -> str:
    return str(gw.admin_get("/admin/policy").json()["version"])


def _error_code(body: bytes) -> int:
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    last = body[: -len(b"data: [DONE]\n\n")].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    return int(orjson.loads(last.removeprefix(b"data: "))["error"]["code"])


def _huge_frame(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 200 and _error_code(body) == 502
    assert b"larger than" in body and len(body) < MIB  # the partial frame never went out


def _huge_header(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 502 and b"head larger than" in body
    assert not any(k.startswith("x-pad") for k in headers)


def _headers(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 200 and body == SEEN
    assert "set-cookie" not in headers and "x-internal-host" not in headers
    assert headers["x-specrouter-variant"] == "raw" and headers.get("server") != "engine/1.0"
    assert headers["retry-after"] == "1"  # allowed: the engine's own back-off


def _html_200(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 502 and b"text/html" in body and b"login required" not in body


def _cr_only(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 200 and body == b"".join(CR_FRAMES)  # relayed, no error event added


def _wrong_id(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 502 and b"another request" in body and b"cmpl-1" not in body


def _served(status: int, headers: httpx.Headers, body: bytes) -> None:
    assert status == 200 and body == SEEN


# (attack, streamed, the expected answer)
ATTACKS = [
    ("huge_frame", True, _huge_frame),
    ("huge_header", False, _huge_header),
    ("headers", False, _headers),
    ("html_200", False, _html_200),
    ("cr_only", True, _cr_only),
    ("wrong_id", False, _wrong_id),
    ("second_response", False, _served),
    ("late_response", False, _served),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("attack", "stream", "expect"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_engine_attack(
    stack: tuple[GatewayServer, RawEngine],
    attack: str,
    stream: bool,
    expect: Callable[[int, httpx.Headers, bytes], None],
) -> None:
    gw, _ = stack
    assert gw.proc is not None
    _wait_ready(gw)
    version, fds = _version(gw), _fds(gw.proc.pid)
    started = time.monotonic()
    expect(*_post(gw, attack, stream=stream))
    assert time.monotonic() - started < 10
    if attack in ("second_response", "late_response"):
        time.sleep(0.4)  # the unsolicited answer has arrived on the kept connection
    # Another client, on whatever connection the gateway reuses: its own answer, promptly.
    started = time.monotonic()
    got = _post(gw, "ok", key=OTHER_KEY)
    assert got[::2] == (200, SEEN), got
    assert time.monotonic() - started < 2
    assert _version(gw) == version
    assert _fds(gw.proc.pid) <= fds + 8
    assert gw.proc.poll() is None


@pytest.mark.timeout(90)
def test_memory_comes_back_after_a_burst_of_large_frames(
    stack: tuple[GatewayServer, RawEngine],
) -> None:
    gw, _ = stack
    assert gw.proc is not None
    for _ in range(2):  # warm: first-use allocations are not what this measures
        _post(gw, "big_frame", stream=True)
    time.sleep(1.0)
    before = _rss_kib(gw.proc.pid)
    for script in ["big_frame", "huge_frame"] * 4:
        _post(gw, script, stream=True)
    # The bound is on the level, not the delay. The push relay's reference cycles (its channel to
    # the client's connection, a stream's parser, a failure's traceback) once held a finished
    # request's buffers until a full collection, 5-20 s later; they are freed at once now.
    deadline = time.monotonic() + 10
    while (after := _rss_kib(gw.proc.pid)) > before * 1.2 and time.monotonic() < deadline:
        time.sleep(0.25)
    _wait_ready(gw)
    assert after <= before * 1.2, f"RSS {before} KiB before the burst, {after} KiB after"


# -- policy documents through the admin API --------------------------------------------------------

ALIAS_BOMB = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def _many_rules(doc: dict[str, Any], n: int) -> str:
    doc["routes"]["coder"]["rules"] = [
        {"name": f"r{i}", "kind": "client", "clients": ["other"], "use": "raw"} for i in range(n)
    ]
    return yaml.safe_dump(doc)


def _put(gw: GatewayServer, text: str | bytes, path: str = "/admin/policy") -> httpx.Response:
    version = _version(gw)
    return httpx.request(
        "PUT" if path == "/admin/policy" else "POST",
        gw.admin + path,
        headers={**AUTH, "if-match": f'"{version}"'},
        content=text,
        timeout=30,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("attack", "needle"),
    [
        ("alias_bomb", "aliases"),
        ("alias_bomb_validate", "aliases"),
        ("rules_1001", "1001 rules"),
        ("over_1_mib", "limit of 1048576 bytes"),
    ],
)
def test_policy_document_attack(
    stack: tuple[GatewayServer, RawEngine], attack: str, needle: str
) -> None:
    gw, _ = stack
    _wait_ready(gw)
    doc = gw.admin_get("/admin/policy").json()["document"]
    text = {
        "alias_bomb": ALIAS_BOMB,
        "alias_bomb_validate": ALIAS_BOMB,
        "rules_1001": _many_rules(doc, 1001),
        "over_1_mib": yaml.safe_dump(doc) + "#" * MIB,
    }[attack]
    path = "/admin/policy/validate" if attack.endswith("validate") else "/admin/policy"
    version = _version(gw)
    served: list[float] = []

    def other_client() -> None:
        started = time.monotonic()
        assert _post(gw, "ok", key=OTHER_KEY)[::2] == (200, SEEN)
        served.append(time.monotonic() - started)

    started = time.monotonic()
    worker = threading.Thread(target=other_client)
    worker.start()
    r = _put(gw, text, path)
    worker.join(10)
    assert r.status_code == 422 and needle in r.text, r.text[:300]
    assert time.monotonic() - started < 5
    assert served and served[0] < 2, served
    assert _version(gw) == version


def test_a_policy_at_the_rule_limit_is_accepted(stack: tuple[GatewayServer, RawEngine]) -> None:
    gw, _ = stack
    doc = gw.admin_get("/admin/policy").json()["document"]
    r = _put(gw, _many_rules(doc, 1000), "/admin/policy/validate")
    assert r.status_code == 200, r.text[:300]
