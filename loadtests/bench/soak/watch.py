"""The gateway as its admin listener and /proc show it: settled or not, each backend's health."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import httpx

from loadtests.harness.gateway import ADMIN_TOKEN
from loadtests.harness.procfs import fd_count, rss_kb, upstream_conns


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (all label sets, or those with `labels`)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


@dataclass(slots=True)
class Settled:
    """The gateway once idle: all of it must be zero but the pooled upstream connections."""

    in_flight: int
    gauge: float
    queued: float
    upstream: dict[int, dict[str, int]]
    rss_kb: int
    fds: int
    waited_s: float

    def established(self, port: int | None = None) -> int:
        return sum(
            s.get("ESTABLISHED", 0) for p, s in self.upstream.items() if port is None or p == port
        )

    def close_wait(self) -> int:
        return sum(s.get("CLOSE_WAIT", 0) for s in self.upstream.values())


def settle(gw: Any, ports: Iterable[int], *, timeout: float = 15.0) -> Settled:
    """Wait until nothing is in flight and no upstream socket waits to be closed; the state
    then. Raises AssertionError with the last reading when it does not settle in time."""
    pid = gw.proc.pid
    ports = list(ports)
    start = time.monotonic()
    last = ""
    while True:
        status = gw.admin_get("/admin/status").json()
        metrics = gw.metrics()
        gauge = metric_sum(metrics, "specrouter_in_flight")
        queued = metric_sum(metrics, "specrouter_queued")
        conns = upstream_conns(pid, ports)
        state = Settled(
            int(status["in_flight"]),
            gauge,
            queued,
            conns,
            rss_kb(pid),
            fd_count(pid),
            time.monotonic() - start,
        )
        if state.in_flight == 0 and gauge == 0 and queued == 0 and state.close_wait() == 0:
            return state
        last = repr(state)
        if time.monotonic() - start > timeout:
            raise AssertionError(f"the gateway did not settle in {timeout:g}s: {last}")
        time.sleep(0.1)


class HealthWatch:
    """Polls /admin/status every `every` seconds: each backend's health over time."""

    def __init__(self, gw: Any, every: float = 0.05) -> None:
        self.gw, self.every = gw, every
        self.timeline: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def __enter__(self) -> HealthWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    data = c.get(
                        self.gw.admin + "/admin/status",
                        headers={"authorization": f"Bearer {self._token()}"},
                    ).json()
                    self.timeline.append(
                        (time.monotonic(), {n: b["health"] for n, b in data["backends"].items()})
                    )
                self._stop.wait(self.every)

    def _token(self) -> str:
        return ADMIN_TOKEN

    def health(self, name: str) -> str:
        return self.timeline[-1][1].get(name, "up") if self.timeline else "up"

    def first(self, name: str, pred: Callable[[str], bool], after: float) -> float | None:
        for t, states in list(self.timeline):
            if t >= after and pred(states.get(name, "up")):
                return t
        return None

    def transitions(self, name: str) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        for t, states in list(self.timeline):
            h = states.get(name, "up")
            if not out or out[-1][1] != h:
                out.append((t, h))
        return out

    def wait(self, name: str, pred: Callable[[str], bool], timeout: float) -> float:
        end = time.monotonic() + timeout
        since = time.monotonic()
        while time.monotonic() < end:
            t = self.first(name, pred, since)
            if t is not None:
                return t
            time.sleep(self.every)
        raise AssertionError(
            f"{name}: health condition not reached in {timeout:g}s; "
            f"transitions {self.transitions(name)[-6:]}"
        )
