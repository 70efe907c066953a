"""Bad inputs under load: each must get its 4xx (or a closed connection) in bounded time."""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from loadtests.bench.soak.client import Requester, classify_reply
from loadtests.harness.hostile import BAD_BODIES
from loadtests.harness.rawhttp import Address, Conn


@dataclass(slots=True)
class BadInput:
    what: str
    expected: str
    got: str
    ms: float
    ok: bool


@dataclass(slots=True)
class Pass:
    n: int
    in_flight: int
    gauge: float
    queued: float
    upstream_established: int
    close_wait: int


# (what, raw request bytes builder, expectation): a status class ("4xx"), an exact status with
# an OpenAI error body ("400"), a status from the HTTP layer before any request exists, with an
# empty body ("408 raw"), or "cut" (the connection is closed, with or without a 4xx first).
RawCase = tuple[str, Callable[[Address, str], bytes], str]


def _post(
    path: str, body: bytes, *, headers: Sequence[tuple[str, str]] = (), key: bool = True
) -> Callable[[Address, str], bytes]:
    return lambda t, k: t.request(path, body, k if key else None, headers=headers)


_CHAT = "/v1/chat/completions"
BAD_INPUTS: list[RawCase] = [
    ("empty body", _post(_CHAT, b""), "400"),
    ("not JSON", _post(_CHAT, b"hello"), "400"),
    ("truncated JSON", _post(_CHAT, b'{"model": "coder", "messages": ['), "400"),
    ("invalid UTF-8", _post(_CHAT, b'{"model": "c\xff\xfeoder", "messages": []}'), "400"),
    ("JSON array", _post(_CHAT, b'[{"model": "coder"}]'), "400"),
    (
        "deep nesting",
        _post(_CHAT, b'{"model":"coder","messages":' + b"[" * 5000 + b"]" * 5000 + b"}"),
        "400",
    ),
    ("no model", _post(_CHAT, b'{"messages": []}'), "400"),
    ("model is a number", _post(_CHAT, b'{"model": 7, "messages": []}'), "400"),
    ("unknown model", _post(_CHAT, b'{"model": "gpt-9", "messages": []}'), "404"),
    (
        "NaN temperature",
        _post(_CHAT, b'{"model": "coder", "messages": [], "temperature": NaN}'),
        "400",
    ),
    (
        "huge max_tokens",
        _post(
            _CHAT,
            b'{"model": "coder", "messages": [{"role": "user", '
            b'"content": "x"}], "max_tokens": 1234567890123456789012345}',
        ),
        "4xx",
    ),
    (
        "negative max_tokens",
        _post(
            _CHAT,
            b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        ),
        "4xx",
    ),
    (
        "stream is not a bool",
        _post(_CHAT, b'{"model": "coder", "messages": [], "stream": [1]}'),
        "4xx",
    ),
    (
        "body over the size limit",
        _post(_CHAT, b'{"model": "coder", "pad": "' + b"x" * 9_000_000 + b'"}'),
        "413",
    ),
    ("no API key", _post(_CHAT, b'{"model": "coder", "messages": []}', key=False), "401"),
    ("wrong API key", lambda t, k: t.request(_CHAT, b'{"model":"coder"}', "sk-wrong"), "401"),
    (
        "pinned unknown variant",
        _post(
            _CHAT, b'{"model": "coder", "messages": []}', headers=[("x-specrouter-variant", "nope")]
        ),
        "400",
    ),
    ("GET on a POST endpoint", lambda t, k: t.request(_CHAT, b"", k, method="GET"), "405"),
    ("unknown path", lambda t, k: t.request("/v1/nothing", b"{}", k), "404"),
    (
        "admin path on the public listener",
        lambda t, k: t.request("/admin/policy", b"{}", k, method="GET"),
        "404",
    ),
    (
        "metrics on the public listener",
        lambda t, k: t.request("/metrics", b"", k, method="GET"),
        "404",
    ),
    (
        "header over 64 KiB",
        lambda t, k: t.request(_CHAT, b"{}", k, headers=[("x-pad", "a" * 100_000)]),
        "431",
    ),
    (
        "content-length larger than the body (slow body)",
        lambda t, k: (
            t.request(_CHAT, b"", k).replace(b"content-length: 0", b"content-length: 100")
            + b'{"mod'
        ),
        "408",
    ),
    (
        "headers never finished (slow headers)",
        lambda t, k: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n",
        "408",
    ),
    ("garbage instead of HTTP", lambda t, k: b"\x00\x01\x02garbage\r\n\r\n", "cut"),
    (
        "invalid chunked encoding",
        lambda t, k: (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
            + k.encode()
            + b"\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n"
        ),
        "cut",
    ),
    (
        "HTTP/1.1 request without TLS",
        lambda t, k: b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
        "tls",
    ),
]


async def _try_one(
    target: Address, key: str, what: str, build: Callable[[Address, str], bytes], expected: str
) -> BadInput:
    t0 = time.monotonic()
    got = ""
    try:
        async with asyncio.timeout(15):
            if expected == "tls":
                # Plain bytes to the TLS port: the handshake fails, the connection is closed.
                plain = await Conn.open(dataclasses.replace(target, tls=None))
                plain.writer.write(build(target, key))
                data = await plain.reader.read(1024)
                plain.writer.close()
                if not data:
                    got = "closed"
                elif data.startswith(b"HTTP/1.1 "):
                    got = data[9:12].decode("latin-1") + " raw"
                else:
                    got = f"closed (after {len(data)} bytes of TLS alert)"
            else:
                conn = await Conn.open(target)
                try:
                    reply = await conn.exchange(build(target, key))
                finally:
                    await conn.close()
                got = str(reply.status) if reply.head else "closed"
                if reply.head and reply.status >= 400:
                    kind, detail = classify_reply(reply, False)
                    if kind != "http_error":
                        got += (
                            " raw"
                            if not reply.body or expected == "cut"
                            else f" (not an OpenAI error: {detail[:60]})"
                        )
    except TimeoutError:
        got = "hang (15 s)"
    except (OSError, ssl.SSLError) as exc:
        got = f"closed ({type(exc).__name__})"
    ms = (time.monotonic() - t0) * 1000
    status = got[:3]
    if expected == "4xx":  # an OpenAI error, whatever the 4xx
        ok = status[:1] == "4" and len(got) == 3
    elif expected in ("cut", "tls"):  # closed, with or without a 4xx before
        ok = got.startswith("closed") or status[:1] == "4"
    elif expected.endswith(" raw"):  # the HTTP layer's answer, before any request exists
        ok = got in (expected, status) and status == expected[:3]
    else:
        ok = got == expected
    return BadInput(what, expected, got, ms, ok)


async def try_bad_inputs(target: Address, key: str) -> list[BadInput]:
    """Every bad input, four at a time, then a good request (the gateway still serves)."""
    sem = asyncio.Semaphore(4)

    async def one(case: RawCase) -> BadInput:
        async with sem:
            return await _try_one(target, key, *case)

    out = list(await asyncio.gather(*(one(c) for c in _cases())))
    r = Requester(target)
    body = orjson.dumps(
        {
            "model": "coder",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "still there?"}],
        }
    )
    after = await r.send(target.request(_CHAT, body, key), stream=False, deadline_s=10)
    await r.close()
    out.append(
        BadInput(
            "a good request after all of these",
            "200",
            str(after.status) if after.status else after.kind,
            (after.t1 - after.t0) * 1000,
            after.kind == "ok",
        )
    )
    return out


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _cases() -> list[RawCase]:
    """The cases above, plus the hostile suite's hand-made malformed bodies."""
    cases = list(BAD_INPUTS)
    ours = {c[0] for c in cases}
    for what, body, headers, status in BAD_BODIES:
        if what in ours or status == 413 or b"embedding" in body:
            continue  # against that suite's own gateway: a 64 KiB body limit, an embed route
        hdrs = [(_text(k), _text(v)) for k, v in dict(headers).items()]
        cases.append((f"{what} (hostile suite)", _post(_CHAT, body, headers=hdrs), str(status)))
    return cases
