"""The faults: kill, hang, 5xx, death mid-stream, flapping, policy PUTs, disconnects, bad input."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import yaml

from loadtests.bench.soak.badinputs import try_bad_inputs
from loadtests.bench.soak.base import SoakBase
from loadtests.bench.soak.load import disconnects, run_async
from loadtests.bench.soak.watch import metric_sum
from loadtests.harness.gateway import ADMIN_TOKEN


class Scenarios(SoakBase):
    def _kill(self, name: str) -> None:
        run = self._begin(f"kill {name}", name)
        sim = self.sims[name]
        sim.kill()
        self._detect(run, name)
        time.sleep(3.0)
        run.end = time.monotonic()
        sim.restart()
        self._finish(run)

    def _hang(self, name: str) -> None:
        run = self._begin(f"hang {name} (idle timeout 2 s)", name)
        sim = self.sims[name]
        sim.fault("hang")
        self._detect(run, name)
        time.sleep(max(0.0, 4.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)

    def _status(self, name: str, mode: str) -> None:
        run = self._begin(f"{mode[5:]} on {name} before the first byte", name)
        sim = self.sims[name]
        sim.fault(mode)
        self._detect(run, name)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)

    def _die(self, name: str, continuation: bool = True) -> None:
        if not continuation:
            self._set_continuation(False)
            time.sleep(1.5)  # requests in flight keep the policy they began with
        run = self._begin(
            f"{name} dies mid-stream (continuation {'on' if continuation else 'off'})", name
        )
        sim = self.sims[name]
        sim.fault("die_mid_stream", after_chunks=5)
        self._detect(run, name)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)
        if not continuation:
            self._set_continuation(True)

    def _set_continuation(self, on: bool) -> None:
        with httpx.Client(
            base_url=self.gw.admin, timeout=10, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}
        ) as admin:
            cur = admin.get("/admin/policy")
            doc = cur.json()["document"]
            doc["routes"]["coder"]["continuation"] = on
            r = admin.put(
                "/admin/policy",
                content=yaml.safe_dump(doc),
                headers={"if-match": cur.headers["etag"]},
            )
            r.raise_for_status()

    def _flap(self, name: str) -> None:
        run = self._begin(f"health flapping ({name}, 4 cycles)", name)
        sim = self.sims[name]
        for _ in range(4):
            # /health fails and new requests get 503. (health_fail alone does not take down a
            # backend that serves traffic: each request served resets its failure count.)
            sim.fault("health_fail")
            sim.fault("http_503")
            if run.detect_s is None:
                self._detect(run, name, timeout=1.0)
            time.sleep(1.0)
            sim.clear_faults()
            time.sleep(1.0)
        run.end = time.monotonic()
        self._finish(run)
        downs = sum(
            1
            for t, h in self.watch.transitions(name)
            if run.start <= t <= run.settle_end and h == "down"
        )
        run.note = f"went down {downs} times in 4 cycles"

    def _policy(self) -> None:
        run = self._begin("policy changes (12 PUTs, 1 stale, 1 invalid)", None)
        auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        statuses: Counter[int] = Counter()
        with httpx.Client(base_url=self.gw.admin, headers=auth, timeout=10) as admin:
            for i in range(12):
                cur = admin.get("/admin/policy")
                doc = cur.json()["document"]
                route = doc["routes"]["coder"]
                route["defaults"] = {"temperature": round(0.5 + 0.05 * i, 2)}
                route["variants"] = ["deep", "shallow"] if i % 2 == 0 else ["shallow", "deep"]
                rule = route["rules"][0]
                rule["use"] = "shallow" if i % 3 else "deep"
                if i == 11:  # back to the soak's own routing
                    route["variants"], rule["use"] = ["deep", "shallow"], "shallow"
                r = admin.put(
                    "/admin/policy",
                    content=yaml.safe_dump(doc),
                    headers={"if-match": cur.headers["etag"]},
                )
                statuses[r.status_code] += 1
                if i == 5:
                    stale = admin.put(
                        "/admin/policy",
                        content=yaml.safe_dump(doc),
                        headers={"if-match": cur.headers["etag"]},
                    )
                    statuses[stale.status_code] += 1
                    bad = dict(doc, routes={"coder": dict(route, variants=["nowhere"])})
                    cur2 = admin.get("/admin/policy")
                    invalid = admin.put(
                        "/admin/policy",
                        content=yaml.safe_dump(bad),
                        headers={"if-match": cur2.headers["etag"]},
                    )
                    statuses[invalid.status_code] += 1
                time.sleep(0.25)
        run.end = time.monotonic()
        run.note = "PUT statuses " + " ".join(f"{k}x{v}" for k, v in sorted(statuses.items()))
        self._finish(run)

    def _disconnects(self) -> None:
        run = self._begin("200 client disconnects", None)
        before = {n: s.stats() for n, s in self.sims.items()}
        gone0 = metric_sum(self.gw.metrics(), "specrouter_client_disconnects_total")
        seen = run_async(disconnects(self.target, self.keys["deep"], 200, concurrency=16), 120)
        deadline = time.monotonic() + 15
        aborted = 0
        while time.monotonic() < deadline:
            aborted = sum(s.stats()["aborted"] - before[n]["aborted"] for n, s in self.sims.items())
            if aborted >= seen["dropped"]:
                break
            time.sleep(0.1)
        gone = metric_sum(self.gw.metrics(), "specrouter_client_disconnects_total") - gone0
        run.end = time.monotonic()
        run.note = (
            f"dropped {seen['dropped']}, upstream aborts {aborted}, gateway counted "
            f"{gone:.0f}, in {run.end - run.start:.1f}s"
            + ("" if seen["dropped"] == 200 else f" ({dict(seen)})")
        )
        if aborted != seen["dropped"] or seen["dropped"] != 200:
            run.note += " MISMATCH"
        self._finish(run, recovered=False)

    def _bad_inputs(self) -> None:
        run = self._begin("bad inputs", None)
        results = run_async(try_bad_inputs(self.target, self.keys["deep"]), 120)
        if not self.bad:
            self.bad = results
        else:
            for prev, new in zip(self.bad, results, strict=True):
                if not new.ok:
                    self.bad[self.bad.index(prev)] = new
        run.end = time.monotonic()
        bad = [b.what for b in results if not b.ok]
        run.note = f"{len(results)} inputs, {len(bad)} unexpected" + (f": {bad}" if bad else "")
        self._finish(run, recovered=False)
