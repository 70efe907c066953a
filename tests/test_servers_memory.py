"""A connection's objects go when it closes, not at a full collection: our protocol puts
channels and callbacks to itself in the request's scope, which the protocol holds, so each must
hold it weakly (a cycle per request kept hundreds of connections, TLS buffers included, alive
under load: tests/bench/test_faults.py's RSS bound)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from typing import Any

from proxy.servers import GuardedHttpToolsProtocol, bind, make_server


async def test_a_disconnected_request_leaves_no_cycle() -> None:
    refs: list[weakref.ref[Any]] = []
    ended = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        extensions = scope["extensions"]
        extensions["specrouter.authenticated"]()  # as the public app does for a valid key
        protocol = extensions["specrouter.push"]._transport.get_protocol()
        assert isinstance(protocol, GuardedHttpToolsProtocol)
        refs.extend([weakref.ref(protocol), weakref.ref(protocol.cycle)])
        del protocol
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        while (await receive())["type"] != "http.disconnect":
            pass  # the client leaves mid-stream
        ended.set()

    sock = bind("127.0.0.1", 0)
    server = make_server(app)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    gc.collect()
    gc.disable()  # from here, only reference counting frees anything
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"data: 1\n\n"), 10)
        writer.transport.abort()
        await asyncio.wait_for(ended.wait(), 10)
        for _ in range(20):  # the request's task and the connection's callbacks finish
            await asyncio.sleep(0.01)
        assert refs and [ref() for ref in refs] == [None, None]
    finally:
        gc.enable()
        server.should_exit = True
        await task
        sock.close()
