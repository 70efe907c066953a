"""proxy/servers.py subclasses uvicorn's private HttpToolsProtocol and the push relay writes to
its transport and flow control directly. uvicorn is pinned to one minor release; this test fails
loudly, naming the missing piece, when an upgrade changes what we rely on."""

from __future__ import annotations

import asyncio
import inspect
from importlib.metadata import version
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from proxy.relay.app import _arrived
from proxy.relay.channel import PushChannel
from proxy.servers import GuardedHttpToolsProtocol, bind, make_server

# Hooks we override, with the signatures we override them with.
OVERRIDDEN = {
    "connection_made": ["self", "transport"],
    "data_received": ["self", "data"],
    "on_message_begin": ["self"],
    "on_headers_complete": ["self"],
    "connection_lost": ["self", "exc"],
    "__init__": ["self", "config", "server_state", "app_state", "_loop"],
    "on_header": ["self", "name", "value"],
    "send_400_response": ["self", "msg"],
    "shutdown": ["self"],
    "on_response_complete": ["self"],
}


def test_startup_still_makes_servers_as_ours_does() -> None:
    """QuietSignalsServer.startup replaces uvicorn's to pass a TLS handshake deadline: uvicorn's
    must still build the protocol from the config and call create_server on the sockets."""
    source = inspect.getsource(uvicorn.Server.startup)
    for piece in (
        "config.http_protocol_class",
        "server_state=self.server_state",
        "loop.create_server(create_protocol, sock=sock, ssl=config.ssl",
        "self.started = True",
    ):
        assert piece in source, f"uvicorn.Server.startup no longer has {piece!r}"
    assert "on_header" in inspect.getsource(HttpToolsProtocol.on_header)
    assert "self.headers.append" in inspect.getsource(HttpToolsProtocol.on_header)


def test_uvicorn_is_the_pinned_minor() -> None:
    major, minor = version("uvicorn").split(".")[:2]
    assert (major, minor) == ("0", "54"), (
        f"uvicorn {version('uvicorn')}: proxy/servers.py was written against 0.54; re-check "
        "GuardedHttpToolsProtocol and PushChannel, then move the pin in pyproject.toml"
    )


@pytest.mark.parametrize("name", sorted(OVERRIDDEN))
def test_overridden_hooks_keep_their_signature(name: str) -> None:
    hook = getattr(HttpToolsProtocol, name, None)
    assert hook is not None, f"uvicorn's HttpToolsProtocol no longer has {name}()"
    assert list(inspect.signature(hook).parameters) == OVERRIDDEN[name]


def test_flow_control_and_cycle_keep_what_the_push_relay_reads() -> None:
    assert inspect.iscoroutinefunction(FlowControl.drain)
    assert "write_paused" in FlowControl.__init__.__code__.co_names or hasattr(
        FlowControl, "write_paused"
    )
    init = inspect.getsource(RequestResponseCycle.__init__)
    for name in ("disconnected", "response_started", "response_complete"):
        assert f"self.{name} = False" in init, f"uvicorn's cycle no longer has {name}"
    # The public app reads a body already in without a timer (proxy/relay/app.py `_arrived`).
    assert "self.more_body = True" in init
    assert "self.cycle.more_body = False" in inspect.getsource(
        HttpToolsProtocol.on_message_complete
    )
    # PushChannel.end_unfinished marks the cycle disconnected so that this check stays quiet.
    run_asgi = inspect.getsource(RequestResponseCycle.run_asgi)
    assert "elif not self.response_complete and not self.disconnected:" in run_asgi


async def test_a_live_connection_exposes_transport_flow_and_cycle() -> None:
    """A real server on loopback: the push channel our protocol offers reads uvicorn's own
    transport, flow control and response cycle of that connection."""
    seen: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        channel = scope["extensions"]["specrouter.push"]
        proto = channel._protocol  # a weak proxy: checked while the connection lives
        seen.update(
            channel=channel,
            proto=isinstance(proto, GuardedHttpToolsProtocol),
            transport=proto.transport,
            flow=proto.flow,
            cycle=proto.cycle,
            gone=channel.gone,
            arrived=_arrived(receive),  # a GET's body (none) is whole before the app runs
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/plain")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok", "more_body": True})
        channel.write(b"pushed")  # a chunk written straight to the transport
        await send({"type": "http.response.body", "body": b""})

    sock = bind("127.0.0.1", 0)
    server = make_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = sock.getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    finally:
        server.should_exit = True
        await task
        sock.close()
    assert isinstance(seen["channel"], PushChannel)
    assert seen["proto"] is True
    assert isinstance(seen["transport"], asyncio.Transport)
    assert isinstance(seen["flow"], FlowControl)
    assert isinstance(seen["cycle"], RequestResponseCycle)
    assert seen["gone"] is False
    assert seen["arrived"] is True
    assert b"transfer-encoding: chunked" in reply.lower()
    assert b"\r\n2\r\nok\r\n6\r\npushed\r\n0\r\n\r\n" in reply


async def test_held_bytes_go_out_with_the_next_write_whoever_writes_it() -> None:
    """`hold_head`: the head uvicorn writes is kept until a pushed chunk carries it, a flush,
    or uvicorn's own next write (the end); `hold_last`: an end event kept for uvicorn's end.
    Every response stays whole and in order."""
    writes: list[bytes] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        channel = scope["extensions"]["specrouter.push"]
        transport = channel._transport
        channel.hold_head()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        assert channel._held  # held, not written
        if scope["path"] == "/pushed":
            channel._transport = _Counting(transport, writes)
            channel.write(b"first")
            channel._transport = transport
        elif scope["path"] == "/flushed":
            channel.flush_head()
        elif scope["path"] == "/last":
            channel.write(b"first")
            channel._transport = _Counting(transport, writes)
            before = len(writes)
            channel.hold_last(b"last")
            assert len(writes) == before  # held for uvicorn's end
        await send({"type": "http.response.body", "body": b"end", "more_body": False})

    sock = bind("127.0.0.1", 0)
    server = make_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    replies = []
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        for path in ("/pushed", "/flushed", "/uvicorn", "/last"):
            writer.write(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
            replies.append((head, body))
        writer.close()
    finally:
        server.should_exit = True
        await task
        sock.close()
    for head, _ in replies:
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"transfer-encoding: chunked" in head
    assert [body for _, body in replies] == [
        b"5\r\nfirst\r\n3\r\nend\r\n0\r\n\r\n",
        b"3\r\nend\r\n0\r\n\r\n",
        b"3\r\nend\r\n0\r\n\r\n",
        b"5\r\nfirst\r\n4\r\nlast\r\n3\r\nend\r\n0\r\n\r\n",
    ]
    # the head and the first chunk in one write
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert writes[0].endswith(b"\r\n\r\n5\r\nfirst\r\n")
    # a held end event and uvicorn's end in one write
    assert writes[-1] == b"4\r\nlast\r\n3\r\nend\r\n0\r\n\r\n"


class _Counting:
    """A transport that records what is written through it, for one chunk's write."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport, self._writes = transport, writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._transport.close()
