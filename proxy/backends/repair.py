"""Guarded repair: restart a backend that stays down, within strict limits.

The speculative path has crashed the GB10's engine; an engine that stays down should come back
without a person. The gateway runs the action the backend names, as the operator file defines it
(`docker restart NAME`, `systemctl restart NAME`; the policy cannot define a command), only after the backend has been down for `after_down_s`, at most
`max_per_hour` times an hour, never while it is starting (a cold start takes minutes and a
restart would begin it again), one at a time. Every attempt is logged, counted and kept for
the dashboard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from policies.schema import BackendSpec
from proxy.gateway import Gateway

log = logging.getLogger("specrouter.repair")


@dataclass(slots=True)
class Attempt:
    backend: str
    started: float  # wall clock
    result: str = "running"  # ok, failed, timeout
    returncode: int | None = None
    output: str = ""


@dataclass(slots=True)
class _State:
    down_since: float | None = None
    attempts: deque[float] = field(default_factory=lambda: deque(maxlen=64))  # monotonic
    running: asyncio.Task[None] | None = None


class Repairer:
    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self._states: dict[str, _State] = {}
        self.history: deque[Attempt] = deque(maxlen=50)

    def observe(self, name: str, backend: BackendSpec, now: float) -> None:
        """Called after each health round for each backend."""
        st = self._states.setdefault(name, _State())
        health = self.gw.live.get(name).health
        if health != "down":
            st.down_since = None
            return
        if st.down_since is None:
            st.down_since = now
        spec = backend.repair
        if spec is None or (st.running is not None and not st.running.done()):
            return
        action = self.gw.operator.action(spec.action)
        if action is None:  # validation refuses such a policy; never run what is not defined
            return
        if now - st.down_since < spec.after_down_s:
            return
        recent = [t for t in st.attempts if now - t < 3600]
        if len(recent) >= spec.max_per_hour:
            return
        st.attempts.append(now)
        attempt = Attempt(name, time.time())
        self.history.append(attempt)
        # The backend restarts now: its failures mean "starting" for its cold-start time.
        self.gw.live.starting(name, now + backend.startup_s)
        st.down_since = None
        st.running = asyncio.get_running_loop().create_task(
            self._run(attempt, action.command, action.timeout_s), name=f"repair-{name}"
        )

    async def _run(self, attempt: Attempt, command: list[str], timeout: float) -> None:
        log.warning("repairing backend %s: %s", attempt.backend, " ".join(command))
        self.gw.events.add("repair_started", backend=attempt.backend, detail=" ".join(command))
        try:
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.DEVNULL,
            )
        except OSError as exc:
            attempt.result, attempt.output = "failed", str(exc)
        else:
            try:
                async with asyncio.timeout(timeout):
                    out, _ = await proc.communicate()
                attempt.returncode = proc.returncode
                attempt.output = out.decode(errors="replace")[-2000:]
                attempt.result = "ok" if proc.returncode == 0 else "failed"
            except TimeoutError:
                proc.kill()
                attempt.result = "timeout"
        self.gw.metrics.repairs.labels(attempt.backend, attempt.result).inc()
        log.warning(
            "repair of %s: %s (exit %s) %s",
            attempt.backend,
            attempt.result,
            attempt.returncode,
            attempt.output.strip()[-300:],
        )
        self.gw.events.add(
            "repair_finished",
            backend=attempt.backend,
            detail=f"{attempt.result} (exit {attempt.returncode})",
        )

    async def aclose(self) -> None:
        for st in self._states.values():
            if st.running is not None and not st.running.done():
                st.running.cancel()
