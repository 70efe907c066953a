"""Servers shared by the tests that need the same configuration: started on first use, stopped
with the module (the `stacks` fixture in tests/conftest.py).

    def test_x(stacks: Stacks, certs) -> None:
        stack = stacks.get(("relay", relay), lambda: sim_gateway(certs, args=("--relay", relay)))

A key names a configuration; tests that share one must leave it as they found it (no faults
left set, no process killed, no policy changed) and must not count what others did (compare
counters before and after, or read rows by request id). A test that kills, reconfigures or
measures a process starts its own.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles

T = TypeVar("T")


class Stacks:
    """Context managers entered once per key and exited, last first, by close()."""

    def __init__(self) -> None:
        self._exit = ExitStack()
        self._made: dict[Hashable, Any] = {}

    def get(self, key: Hashable, make: Callable[[], AbstractContextManager[T]]) -> T:
        if key not in self._made:
            self._made[key] = self._exit.enter_context(make())
        return cast(T, self._made[key])

    def close(self) -> None:
        self._made.clear()
        self._exit.close()


@dataclass
class SimGateway:
    sim: SimServer
    gw: GatewayServer


@contextmanager
def sim_gateway(
    certs: CertFiles,
    *,
    sim: dict[str, Any] | None = None,
    policy: dict[str, Any] | None = None,
    args: tuple[str, ...] = (),
) -> Iterator[SimGateway]:
    """One simulated engine (SimServer's keywords) behind the gateway (coder_policy's keywords,
    its one backend named `a`)."""
    with (
        SimServer(**(sim or {})) as engine,
        GatewayServer(
            coder_policy({"a": engine.url}, **(policy or {})), certs=certs, args=args
        ) as gw,
    ):
        yield SimGateway(engine, gw)
