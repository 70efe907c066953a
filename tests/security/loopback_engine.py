"""An HTTP/1.1 engine stand-in on loopback, in its own thread and event loop, for the attack
tests: the connection handling is here once; each test file says what a request gets."""

from __future__ import annotations

import asyncio
import threading
from typing import Self


class LoopbackEngine:
    """Reads requests one after another on each connection (kept alive while `answer` says
    so); `answer` writes the response."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""
        self.connections = 0

    def __enter__(self) -> Self:
        self.thread.start()
        server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(5)
        self.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def answer(
        self, w: asyncio.StreamWriter, line: str, headers: dict[str, str], body: bytes
    ) -> bool:
        """Write the response to one request; True keeps the connection for the next."""
        raise NotImplementedError

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                line, *fields = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (f.partition(":") for f in fields if f)
                }
                body = await r.readexactly(int(headers.get("content-length", "0")))
                keep = await self.answer(w, line, headers, body)
                await w.drain()
                if not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            w.close()
