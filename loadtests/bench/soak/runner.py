"""The soak itself: two engines and the gateway, passes of every scenario under load."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loadtests.bench.soak.base import LEAN_MALLOC, SERVED, Pass
from loadtests.bench.soak.load import Load
from loadtests.bench.soak.report import Accounting
from loadtests.bench.soak.scenarios import Scenarios
from loadtests.bench.soak.watch import HealthWatch, settle
from loadtests.harness.gateway import CLIENT_KEY, OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.procfs import cpu_seconds, rss_kb
from loadtests.harness.rawhttp import Address
from loadtests.harness.sim import SimServer
from proxy.certs import make_local_ca


class Soak(Scenarios, Accounting):
    # ---- setup --------------------------------------------------------------------------

    def run(self) -> None:
        if self.lean_malloc:
            # glibc keeps freed memory (each new TLS connection's buffers raise the heap's
            # high-water mark); with these, RSS follows what is alive. Allocator settings only.
            os.environ.update(LEAN_MALLOC)
        with (
            tempfile.TemporaryDirectory(prefix="specrouter-faults-") as tmp,
            SimServer(
                "dflash7-prob-block", served_model_name=SERVED, time_scale=0.05, max_num_seqs=64
            ) as deep,
            SimServer(
                "mtp3", served_model_name=SERVED, time_scale=0.05, max_num_seqs=64
            ) as shallow,
        ):
            certs = make_local_ca(Path(tmp) / "tls")
            policy = coder_policy(
                {"deep": deep.url, "shallow": shallow.url},
                rules=[
                    {
                        "name": "other-shallow",
                        "kind": "client",
                        "clients": ["other"],
                        "use": "shallow",
                    }
                ],
            )
            for b in policy["backends"].values():
                b.update({"startup_s": 0, "max_concurrency": 64})
            policy["routes"]["coder"]["continuation"] = True
            policy["health"] = {"fail_after": 2, "recover_after": 2}
            args = (
                "--idle-timeout",
                "2",
                "--first-byte-timeout",
                "3",
                "--drain-timeout",
                "3",
                "--header-timeout",
                "2",
                "--body-timeout",
                "2",
            )
            with GatewayServer(policy, certs=certs, args=args) as gw, HealthWatch(gw) as watch:
                self.gw, self.watch = gw, watch
                self.sims = {"deep": deep, "shallow": shallow}
                self.target = Address.of(gw.base, certs.ca_cert)
                self.keys = {"deep": CLIENT_KEY, "shallow": OTHER_KEY}
                self._soak()

    def _soak(self) -> None:
        assert self.gw.proc is not None
        pid = self.gw.proc.pid
        ports = [s.port for s in self.sims.values()]
        # Warm-up: a few seconds of load so RSS at start is past the first allocations.
        with Load(self.target, [self.keys["deep"], self.keys["shallow"]], deadline_s=30) as warm:
            time.sleep(3)
        self.outcomes += warm.stop()
        settle(self.gw, ports)
        self.rss_start = self.rss_max = rss_kb(pid)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        self.t_start = t0
        budget = self.minutes * 60.0
        scenarios = self._scenarios()
        n = 0
        while True:
            n += 1
            self.log(f"pass {n}: {time.monotonic() - t0:.0f}s of {budget:.0f}s")
            load = self.load = Load(
                self.target, [self.keys["deep"], self.keys["shallow"]], deadline_s=30
            ).start()
            try:
                for name, fn in scenarios:
                    if not self.quick and time.monotonic() - t0 > budget:
                        break
                    self._quiet(2.0)
                    self.log(f"  {name}")
                    fn()
                    self.rss_max = max(self.rss_max, rss_kb(pid))
                self._quiet(2.0)
            finally:
                self.outcomes += load.stop()
                self.load = None
            state = settle(self.gw, ports, timeout=20)
            self.passes.append(
                Pass(
                    n,
                    state.in_flight,
                    state.gauge,
                    state.queued,
                    state.established(),
                    state.close_wait(),
                    state.rss_kb,
                    state.fds,
                    state.waited_s,
                )
            )
            self.rss_max = max(self.rss_max, state.rss_kb)
            if self.quick or time.monotonic() - t0 > budget:
                break
        self.t_end = time.monotonic()
        self.cpu_s = cpu_seconds(pid) - cpu0
        self.gateway_cpu_pct = 100.0 * self.cpu_s / (self.t_end - t0)
        self.rss_end = rss_kb(pid)

    def _quiet(self, seconds: float) -> None:
        time.sleep(seconds)

    def _scenarios(self) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("kill deep", lambda: self._kill("deep")),
            ("hang deep (idle timeout)", lambda: self._hang("deep")),
            ("500 on shallow before first byte", lambda: self._status("shallow", "http_500")),
            ("503 on deep before first byte", lambda: self._status("deep", "http_503")),
            ("deep dies mid-stream (continued)", lambda: self._die("deep")),
            ("shallow dies mid-stream (continuation off)", lambda: self._die("shallow", False)),
            ("health flapping (shallow)", lambda: self._flap("shallow")),
            ("policy changes", self._policy),
            ("kill shallow", lambda: self._kill("shallow")),
            ("200 client disconnects", self._disconnects),
            ("bad inputs", self._bad_inputs),
        ]
