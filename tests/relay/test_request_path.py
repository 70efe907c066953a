"""The request path's shape, checked on proxy/relay/'s source: no function takes
more than six parameters (the request travels as one `Exchange`, its state grouped by phase),
and nothing branches on the kind of upstream response, because both relays' responses are one
interface, `UpstreamResponse`. (mypy checks that statically too: `Relay`'s type variable is
bound to it.)
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

import proxy.relay
from proxy.relay.engine_conn import EnginePool, open_engine_stream
from proxy.relay.exchange import Arrival, Decided, EngineLink, Exchange, PlainBody, StreamRelay
from proxy.relay.upstream import PulledResponse, Upstream, UpstreamResponse

RELAY = Path(proxy.relay.__file__).parent
MAX_PARAMS = 6
UPSTREAM_TYPES = {"EngineStream", "PulledResponse", "ClientResponse", "UpstreamResponse"}

Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda


def _functions(tree: ast.AST) -> Iterator[Function]:
    for node in ast.walk(tree):
        if isinstance(node, Function):
            yield node


def _params(node: Function) -> list[str]:
    """Every parameter, keyword-only and starred ones too, `self`/`cls` left out."""
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [f"*{p.arg}" for p in (a.vararg, a.kwarg) if p is not None]
    return names[1:] if names[:1] in (["self"], ["cls"]) else names


def _names(node: ast.AST) -> set[str]:
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
    return out


def _type_branches(tree: ast.AST) -> Iterator[ast.expr]:
    """isinstance/issubclass against an upstream response type, or `type(r) is/== T`."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass")
            and len(node.args) == 2
        ):
            if _names(node.args[1]) & UPSTREAM_TYPES:
                yield node
        elif (
            isinstance(node, ast.Compare)
            and isinstance(node.left, ast.Call)
            and isinstance(node.left.func, ast.Name)
            and node.left.func.id == "type"
        ):
            if any(_names(c) & UPSTREAM_TYPES for c in node.comparators):
                yield node


# Parsed at collection, before any test runs: CPython 3.11.7's parser can fail with "AST
# constructor recursion depth mismatch" after another test hit a RecursionError (cpython#106905).
_TREES = [
    (path.name, ast.parse(path.read_text(), str(path))) for path in sorted(RELAY.glob("*.py"))
]

_BAD = ast.parse(
    "async def relay(self, a, b, c, d, e, *, f, g): pass\n"
    "def f(resp):\n"
    "    if isinstance(resp, (aiohttp.ClientResponse, int)): pass\n"
    "    return type(resp) is EngineStream\n"
)
_OK = ast.parse("def g(cls, a, *args, **kw): return isinstance(a, ContinuableFilter)")


def _sources() -> Iterator[tuple[str, ast.AST]]:
    yield from _TREES


def test_no_function_on_the_path_takes_more_than_six_parameters() -> None:
    seen = 0
    too_many = []
    for name, tree in _sources():
        for fn in _functions(tree):
            seen += 1
            params = _params(fn)
            if len(params) > MAX_PARAMS:
                label = getattr(fn, "name", "<lambda>")
                too_many.append(f"{name}:{fn.lineno} {label}({', '.join(params)})")
    assert seen > 100  # the whole package was read
    assert too_many == []


def test_nothing_on_the_path_branches_on_the_upstream_response_type() -> None:
    found = [
        f"{name}:{node.lineno} {ast.unparse(node)}"
        for name, tree in _sources()
        for node in _type_branches(tree)
    ]
    assert found == []


def test_the_checks_catch_what_they_forbid() -> None:
    bad = _BAD
    relay, f = _functions(bad)
    assert _params(relay) == ["a", "b", "c", "d", "e", "f", "g"]
    assert _params(f) == ["resp"]
    assert len(list(_type_branches(bad))) == 2
    ok = _OK
    assert [_params(f) for f in _functions(ok)] == [["a", "*args", "*kw"]]
    assert list(_type_branches(ok)) == []


def test_each_field_of_the_exchange_has_one_phase_and_set_once_phases_are_frozen() -> None:
    set_once = (Arrival, Decided, StreamRelay, PlainBody)
    owners: dict[str, list[str]] = {name: ["Exchange"] for name in Exchange.__slots__}
    for phase in (*set_once, EngineLink):
        assert "__slots__" in phase.__dict__, phase  # no per-request __dict__
        for field in dataclasses.fields(phase):
            owners.setdefault(field.name, []).append(phase.__name__)
        frozen = getattr(phase, "__dataclass_params__").frozen  # noqa: B009
        assert frozen == (phase in set_once), phase
    assert {name: o for name, o in owners.items() if len(o) > 1} == {}
    plain = PlainBody(None, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.rename = (b"a", b"b")  # type: ignore[misc]


RESPONSE = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nx-engine: one\r\n"
    b"content-length: 6\r\n\r\ndata: "
)


@asynccontextmanager
async def _engine() -> AsyncIterator[str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)  # the body: {}
        writer.write(RESPONSE)
        await writer.drain()
        await reader.read()  # until the client closes
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/chat/completions"
    finally:
        server.close()


async def test_both_upstream_responses_are_the_one_interface() -> None:
    headers = {"content-type": "application/json"}
    async with _engine() as url:
        pool = EnginePool()
        upstream = Upstream(connect_timeout=5, first_byte_timeout=5)
        try:
            pushed = await open_engine_stream(pool, url, b"{}", headers, 5)
            pulled = await upstream.post(url, b"{}", headers)
            assert isinstance(pulled, PulledResponse)
            for resp in (pushed, pulled):
                assert isinstance(resp, UpstreamResponse)
                assert resp.status == 200
                assert resp.headers["content-type"] == "text/event-stream"
                assert (b"x-engine", b"one") in [(k.lower(), v) for k, v in resp.raw_headers]
                assert await resp.first_bytes() == b"data: "
                resp.finish(True)
        finally:
            pool.close()
            await upstream.aclose()
        await asyncio.sleep(0.05)  # the engine sees both connections close
