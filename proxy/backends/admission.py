"""Admission: a concurrency limit per backend, and a queue that is fair between clients.

When a backend has `max_concurrency` requests open, the next ones wait here rather than in
vLLM's FIFO: the gateway picks whom to admit next, round robin over the waiting clients, so an
agent firing 50 requests cannot starve another's single one. Waiting ends in admission, in a
timeout (the caller answers 503 + Retry-After), or in cancellation (the client left).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass, field


class AdmissionTimeout(Exception):
    pass


@dataclass(slots=True)
class _Gate:
    in_use: int = 0
    # client -> its waiters in arrival order; the dict's order is the round-robin order.
    waiting: OrderedDict[str, deque[asyncio.Future[None]]] = field(default_factory=OrderedDict)

    def queued(self) -> int:
        return sum(len(q) for q in self.waiting.values())


class Admission:
    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    def gate(self, backend: str) -> _Gate:
        g = self._gates.get(backend)
        if g is None:
            g = self._gates[backend] = _Gate()
        return g

    def queued(self, backend: str) -> int:
        return self.gate(backend).queued()

    def try_acquire(self, backend: str, limit: int) -> bool:
        """Take a slot if one is free and nobody waits: the common case, with no await."""
        g = self.gate(backend)
        if g.in_use < limit and not g.waiting:
            g.in_use += 1
            return True
        return False

    async def acquire(self, backend: str, limit: int, client: str, timeout: float) -> None:
        if self.try_acquire(backend, limit):
            return
        g = self.gate(backend)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        g.waiting.setdefault(client, deque()).append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut
        except TimeoutError:
            self._forget(g, client, fut)
            raise AdmissionTimeout(
                f"{backend}: {limit} requests open, queued for {timeout:g}s"
            ) from None
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(backend, limit)  # admitted as we were cancelled: pass it on
            else:
                self._forget(g, client, fut)
            raise

    def release(self, backend: str, limit: int) -> None:
        g = self.gate(backend)
        g.in_use -= 1
        while g.waiting and g.in_use < limit:
            client, queue = next(iter(g.waiting.items()))
            fut = queue.popleft()
            if queue:
                g.waiting.move_to_end(client)  # this client had its turn
            else:
                del g.waiting[client]
            if not fut.done():
                g.in_use += 1
                fut.set_result(None)

    @staticmethod
    def _forget(g: _Gate, client: str, fut: asyncio.Future[None]) -> None:
        queue = g.waiting.get(client)
        if queue is not None and fut in queue:
            queue.remove(fut)
            if not queue:
                del g.waiting[client]
