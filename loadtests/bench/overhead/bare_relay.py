"""A bare relay: Starlette + aiohttp, TLS by uvicorn on uvloop, that parses nothing.

`python -m loadtests.bench.overhead.bare_relay --upstream http://127.0.0.1:PORT --cert C --key K`

The floor a Python gateway on the same stack (uvicorn on uvloop, as `specrouter serve` runs, an
ASGI app, aiohttp to the engine) cannot go below: the request body is read and forwarded as
bytes, the engine's answer relayed chunk by chunk. No authentication, no JSON, no policy. The
overhead benchmark runs it beside the gateway so that what the gateway's own work costs
(parsing, checks, the decision, the measurement) is the difference between the two columns.

`--json`: the same relay, but the body is parsed with orjson and written back before it is
forwarded (the tree freed once written): one parse and one write of the body, nothing else.
The overhead goals allow the gateway that much over the bare relay; this target measures it in
the same run, as warm or cold as the machine leaves the caches, instead of a figure timed alone.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


def make_app(upstream: str, *, parse: bool = False) -> Starlette:
    session: aiohttp.ClientSession | None = None

    async def relay(request: Request) -> Response:
        nonlocal session
        if session is None:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, force_close=False),
                auto_decompress=False,
            )
        body = await request.body()
        if parse:  # one parse and one write; the tree is freed before the engine is asked
            body = orjson.dumps(orjson.loads(body))
        headers = {k: v for k, v in request.headers.items() if k not in _HOP}
        resp = await session.post(upstream + request.url.path, data=body, headers=headers)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for data in resp.content.iter_any():
                    yield data
            finally:
                resp.release()

        out = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
        return StreamingResponse(chunks(), status_code=resp.status, headers=out)

    return Starlette(routes=[Route("/{path:path}", relay, methods=["POST"])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.overhead.bare_relay")
    ap.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--json", action="store_true", help="parse the body and write it back")
    args = ap.parse_args(argv)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit it: without, the response head and the first event are two
    # small writes and Nagle holds the second for the client's delayed ACK (~40 ms).
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", 0))
    # Listening before the ready line: a client that connects at once is queued, not refused.
    sock.listen(2048)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        make_app(args.upstream.rstrip("/"), parse=args.json),
        ssl_certfile=args.cert,
        ssl_keyfile=args.key,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        timeout_keep_alive=300,
    )
    server = uvicorn.Server(config)
    print(f"bare relay listening on https://127.0.0.1:{port}", flush=True, file=sys.stderr)
    # `loop="uvloop"` above only applies to uvicorn.run(); serve() runs on the caller's loop.
    uvloop.run(server.serve(sockets=[sock]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
