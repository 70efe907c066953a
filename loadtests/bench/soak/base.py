"""The soak's state and the steps every scenario shares: open a window, detect, recover."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from loadtests.bench.soak.badinputs import BadInput
from loadtests.bench.soak.client import Outcome
from loadtests.bench.soak.load import Load, burst, run_async
from loadtests.bench.soak.watch import HealthWatch, metric_sum
from loadtests.harness.gateway import GatewayServer
from loadtests.harness.rawhttp import Address
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
LEAN_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "16384", "MALLOC_TRIM_THRESHOLD_": "0"}


@dataclass(slots=True)
class ScenarioRun:
    name: str
    failing: str | None  # the backend that fails, if any
    start: float
    end: float = 0.0  # the fault's end (restart, faults cleared)
    settle_end: float = 0.0  # the window closes here (recovered, or a grace after the end)
    detect_s: float | None = None
    recover_s: float | None = None
    continued: float = 0.0
    note: str = ""


@dataclass(slots=True)
class Pass:
    n: int
    in_flight: int
    gauge: float
    queued: float
    upstream_established: int
    close_wait: int
    rss_kb: int
    fds: int
    settle_s: float


class SoakBase:
    gw: GatewayServer
    watch: HealthWatch
    sims: dict[str, SimServer]
    target: Address
    keys: dict[str, str]

    def __init__(
        self,
        *,
        minutes: float,
        quick: bool,
        seed: int = 0,
        lean_malloc: bool = True,
        log: Callable[[str], None] = print,
    ) -> None:
        self.minutes, self.quick, self.log = minutes, quick, log
        self.lean_malloc = lean_malloc
        self.rng = random.Random(seed)
        self.runs: list[ScenarioRun] = []
        self.passes: list[Pass] = []
        self.bad: list[BadInput] = []
        self.outcomes: list[Outcome] = []
        self.t_start = 0.0
        self.t_end = 0.0
        self.rss_start = self.rss_end = self.rss_max = 0
        self.cpu_s = 0.0
        self.gateway_cpu_pct = 0.0
        self.load: Load | None = None

    # ---- a scenario's window -----------------------------------------------------------

    def _begin(self, name: str, failing: str | None) -> ScenarioRun:
        run = ScenarioRun(name, failing, time.monotonic())
        run.continued = -self._continued()
        self.runs.append(run)
        return run

    def _continued(self) -> float:
        return metric_sum(self.gw.metrics(), "specrouter_continuations_total")

    def _finish(self, run: ScenarioRun, recovered: bool = True) -> None:
        """Close the window: wait for the backend to be up and to serve again."""
        name = run.failing
        if name is not None and recovered:
            try:
                t_up = self.watch.wait(name, lambda h: h == "up", timeout=20)
                served = self._served_by(name, after=t_up, timeout=10)
                run.recover_s = max(t_up, served) - run.end
            except AssertionError as exc:
                run.note = str(exc)[:200]
        time.sleep(0.5)
        run.settle_end = time.monotonic()
        run.continued += self._continued()

    def _served_by(self, name: str, after: float, timeout: float) -> float:
        """When a request first went to `name` and came back ok after `after`."""
        end = time.monotonic() + timeout
        key = self.keys[name]
        while time.monotonic() < end:
            body = {
                "model": "coder",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "ping"}],
            }
            out: Outcome = run_async(burst(self.target, [(key, body)], deadline_s=10), 15)[0]
            self.outcomes.append(out)
            if out.kind == "ok" and out.backend == name and out.t0 >= after:
                return out.t1
            time.sleep(0.1)
        raise AssertionError(f"{name} did not serve again in {timeout:g}s")

    def _detect(self, run: ScenarioRun, name: str, timeout: float = 10.0) -> None:
        """The first sign of the fault: health leaves `up`, or a client sees an error from it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = self.watch.first(name, lambda h: h != "up", run.start)
            errs = [
                o.t1
                for o in self._live_outcomes()
                if o.errored and o.backend == name and o.t1 >= run.start
            ]
            cands = [x for x in (t, min(errs, default=None)) if x is not None]
            if cands:
                run.detect_s = min(cands) - run.start
                return
            time.sleep(0.05)

    def _live_outcomes(self) -> list[Outcome]:
        return list(self.load.outcomes) if self.load is not None else []
