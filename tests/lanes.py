"""How the suite spreads over pytest-xdist's workers (`make test TEST_WORKERS=4`).

The suite mostly waits (servers starting, watchdogs' clocks, engines' answers): run in one
process it keeps 0.6 of the 2 cores busy, so it runs in more workers than cores. A unit of work
is a module, whose module-scoped stacks (tests/stacks.py) and package demo start once in the
worker that runs it; the real-vLLM folders are one unit, as they share the engines booted by
tests/engines/boot.py (at most three at once, about 3 GiB each).

Two lanes. Worker "gw0" runs the TIMED modules, whose assertions read a clock (a timeout that
must fire within a bound, a probe's figures, a health checker's window, a rate per minute) or
whose servers must keep up with one, then the engines' unit, then any unit left; it boots the
engines one at a time from the end of its collection, beside the timed modules, as a
one-process run does. The other workers run every other module at a lower CPU priority
(`NICE`, inherited by the servers they start): gw0's tests keep the cores first, the others
take most of the time gw0 leaves idle (at nice 19 they got so little that a forked simulator
took over 5 s to exit). A test that fails under load in the second lane belongs in TIMED.

A worker that is not gw0 is given gw0's units only once gw0 is gone (it crashed): slower, not
wrong (the engines boot when their first test asks).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pytest
from xdist.remote import Producer
from xdist.scheduler.loadscope import LoadScopeScheduling
from xdist.workermanage import WorkerController

ENGINES = "real-vllm"
FIRST_WORKER = "gw0"
NICE = 10
TIMED = (
    "tests/bench/test_faults.py",
    "tests/probe/test_probe.py",
    "tests/probe/test_probe_pair.py",
    "tests/replay/test_watchdogs.py",
    "tests/relay/test_gateway_relay.py",
    "tests/relay/test_adapt.py",
    "tests/security/test_policy_attacks.py",
    "tests/relay/test_keepalive.py",
    "tests/bench/test_overhead_smoke.py",
    "tests/security/test_input_attacks.py",
    "tests/relay/test_limits.py",
    "tests/relay/test_stream_cases.py",
    "tests/relay/test_sessions_e2e.py",
    "tests/observe/test_measures_e2e.py",
)


def unit_of(nodeid: str, engine_folders: Iterable[str]) -> str:
    """The unit a test runs in: its module, or ENGINES for the real-vLLM folders."""
    module = nodeid.split("::", 1)[0]
    return ENGINES if any(module.startswith(f"{f}/") for f in engine_folders) else module


def worker() -> str:
    """This process's xdist worker, FIRST_WORKER in a run without workers."""
    return os.environ.get("PYTEST_XDIST_WORKER", FIRST_WORKER)


def settle() -> None:
    """A second-lane worker lowers its CPU priority, once, before it starts anything."""
    if worker() != FIRST_WORKER:
        os.nice(NICE)


class Lanes(LoadScopeScheduling):
    """pytest-xdist's scope scheduling with the units and lanes above."""

    def __init__(
        self, config: pytest.Config, log: Producer | None = None, *, engine_folders: tuple[str, ...]
    ) -> None:
        super().__init__(config, log)
        self._engine_folders = engine_folders

    def add_node(self, node: WorkerController) -> None:
        super().add_node(node)
        if node.gateway.id == FIRST_WORKER:  # xdist shuts the last added down when idle
            self.assigned_work = {node: self.assigned_work.pop(node), **self.assigned_work}

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid, self._engine_folders)

    def _first_lane(self, node: WorkerController) -> bool:
        """gw0, or while gw0 is gone (it crashed) the first worker left."""
        live = [n for n in self.nodes if not n.shutting_down]
        holder = next((n for n in live if n.gateway.id == FIRST_WORKER), live[0] if live else None)
        return node is holder

    def _assign_work_unit(self, node: WorkerController) -> None:
        """gw0: the timed modules, the engines, then any other; the others: any but those."""
        first = (*TIMED, ENGINES)
        if self._first_lane(node):
            scope = next((s for s in first if s in self.workqueue), next(iter(self.workqueue)))
        else:
            scope = next((s for s in self.workqueue if s not in first), "")
            if not scope:  # what is left is gw0's: this worker is done (and runs the last
                node.shutdown()  # test it holds: a worker keeps one back until told more)
                return
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(n) for n, done in work_unit.items() if not done])


class Scheduler:
    """The plugin that gives xdist's controller the scheduler above."""

    def __init__(self, engine_folders: tuple[str, ...]) -> None:
        self._engine_folders = engine_folders

    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: Producer) -> Lanes:
        return Lanes(config, log, engine_folders=self._engine_folders)
