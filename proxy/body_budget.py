"""Request bodies' memory, bounded across the process and per client.

`max_body_bytes` bounds one request; without a bound over requests, one client's 24
concurrent 8 MiB requests to a slow engine took the gateway's RSS from 130 to 673 MB (48 of
them to 1,042 MB), over the 512 MiB its Kubernetes limit allows. So each request takes its
body's bytes from a budget before reading it (its declared length, else `max_body_bytes`, cut
to what arrived once read) and gives them back when it ends, however it ends: a held turn
(session-aware admission) keeps its body, so it counts while it waits. A request that does
not fit waits up to `body_budget_wait_s` for others to end, then gets 503 with Retry-After. A
client with nothing in flight, or a process with nothing in flight, always gets one request
through, whatever its size: a budget never refuses a request forever.

The numbers, from one place: the gateway's memory (`GATEWAY_MEMORY_MIB`) is the Kubernetes
limit (deploy/k8s/deployment.yaml, checked by tests/security/test_body_budget.py) and the
deploy plan's reservation (proxy/ops/deploy/memory.py); the default budget is what is left of
it above an idle gateway and its other buffers, divided by what a body costs while its
request runs (its bytes, the parsed JSON, the bytes sent on: up to ~4.5x for the worst shapes
the container cap allows, twelve 8 MiB bodies 484-563 MB).
"""

from __future__ import annotations

import asyncio
from typing import Final

MIB: Final = 1 << 20
GATEWAY_MEMORY_MIB: Final = 512  # the container's limit and the deploy plan's reservation
# an idle gateway's RSS (130 MB measured) and its session table, with the previous turns kept
# for the prefix accounting (proxy/backends/prefix.py's BASELINE_BYTES, 16 MiB)
IDLE_MIB: Final = 160
OTHER_MIB: Final = 96  # streams' buffers, engine connections, the allocator's free heap
BODY_COST: Final = 5  # memory per body byte while its request runs (worst shapes ~4.5x)
# (512 - 160 - 96) MiB / 5 = 51.2 MiB of bodies across the process; a client half of it.
BODY_BUDGET_BYTES: Final = (GATEWAY_MEMORY_MIB - IDLE_MIB - OTHER_MIB) * MIB // BODY_COST
BODY_BUDGET_PER_CLIENT_BYTES: Final = BODY_BUDGET_BYTES // 2


class BodyBudget:
    """Body bytes taken by requests in flight, in all and per client. Owned by the event loop."""

    def __init__(self, total: int, per_client: int) -> None:
        self.total, self.per_client = total, per_client
        self.used = 0
        self.by_client: dict[str, int] = {}
        self._freed = asyncio.Event()
        self._waiting = 0  # requests waiting for bytes: only they need the event set

    def try_take(self, client: str, n: int) -> bool:
        mine = self.by_client.get(client, 0)
        if (self.used and self.used + n > self.total) or (mine and mine + n > self.per_client):
            return False
        self.used += n
        self.by_client[client] = mine + n
        return True

    async def take(self, client: str, n: int, wait_s: float) -> BodyLease | None:
        """Take `n` bytes for `client`, waiting up to `wait_s` for others to give theirs back;
        None when they did not."""
        if self.try_take(client, n):
            return BodyLease(self, client, n)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        self._waiting += 1
        try:
            while (left := deadline - loop.time()) > 0:
                try:
                    await asyncio.wait_for(self._freed.wait(), left)
                except TimeoutError:
                    return None
                if self.try_take(client, n):
                    return BodyLease(self, client, n)
            return None
        finally:
            self._waiting -= 1

    def give(self, client: str, n: int) -> None:
        """Give back `n` of `client`'s bytes (all of a request's, or what it did not use)."""
        if n <= 0:
            return
        self.used -= n
        left = self.by_client.get(client, 0) - n
        if left > 0:
            self.by_client[client] = left
        else:
            self.by_client.pop(client, None)
        if self._waiting:  # a new event per give costs every request; only waiters need one
            self._freed.set()
            self._freed = asyncio.Event()


class BodyLease:
    """One request's bytes of the budget: cut to its body once read, given back at its end."""

    def __init__(self, budget: BodyBudget, client: str, n: int) -> None:
        self.budget, self.client, self.n = budget, client, n

    def fit(self, size: int) -> None:
        """The body has arrived: keep what it takes, give back the rest."""
        if size < self.n:
            self.budget.give(self.client, self.n - size)
            self.n = size

    def release(self) -> None:
        self.budget.give(self.client, self.n)
        self.n = 0
