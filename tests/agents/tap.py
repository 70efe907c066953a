"""A recording TLS relay: the agents talk to it as to the gateway, it keeps each request exactly
as the agent sent it (method, path, headers, body bytes) and relays it, streamed, to the demo.

Secrets are not kept: `authorization` and `x-api-key` (the demo's client key) are left out of
the record, and so are the connection's own headers (`host`, `content-length`).
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.certs import CertFiles

# Not recorded: secrets and what belongs to one connection.
UNRECORDED = frozenset({"authorization", "x-api-key", "host", "content-length", "connection"})
# Not relayed back: hop-by-hop, or recomputed by aiohttp.
_HOP = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive"})


@dataclass
class Tap:
    """`with Tap(upstream_port, certs) as tap:` listens on `tap.base` (https .../v1)."""

    upstream_port: int
    certs: CertFiles
    session: str = ""  # the label written on each request recorded from now on
    requests: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0

    def __enter__(self) -> Tap:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        ready.wait(20)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(20)

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.port}/v1"

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main(ready))
        self._loop.close()

    async def _main(self, ready: threading.Event) -> None:
        self._stopping = asyncio.Event()
        server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server_ctx.load_cert_chain(self.certs.cert, self.certs.key)
        self._client_ctx = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        self._http = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=300)
        )
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._relay)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        ready.set()
        await self._stopping.wait()
        await runner.cleanup()
        await self._http.close()

    async def _relay(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        entry: dict[str, Any] = {
            "session": self.session,
            "method": request.method,
            "path": request.path_qs,
            "headers": [
                [k.lower(), v] for k, v in request.headers.items() if k.lower() not in UNRECORDED
            ],
            "body": body.decode("utf-8"),
        }
        self.requests.append(entry)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        url = f"https://127.0.0.1:{self.upstream_port}{request.path_qs}"
        async with self._http.request(
            request.method, url, headers=headers, data=body, ssl=self._client_ctx
        ) as up:
            entry["status"] = up.status
            out = web.StreamResponse(status=up.status)
            for k, v in up.headers.items():
                if k.lower() not in _HOP:
                    out.headers.add(k, v)
            await out.prepare(request)
            try:
                async for chunk in up.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
            except ConnectionResetError:  # the agent hung up after what it needed (Codex)
                pass
            return out
