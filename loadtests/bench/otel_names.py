"""Long model names against a gateway that exports OpenTelemetry:
`python -m loadtests.bench.otel_names [--requests 300] [--kib 1024] [--clients 4]`.

A real gateway (`specrouter serve --otlp-endpoint`, metrics exported every second) in front of
the simulator, exporting over OTLP/HTTP to a receiver on loopback (loadtests/harness/otlp.py)
that keeps nothing and counts bytes. `--clients` threads send `--requests` chat requests, each
naming a different unknown model of `--kib` KiB (404 each), while another client streams short
chats to the known model. Printed: the gateway's RSS and CPU (% of one core) idle before, over
the burst and over the `--settle` seconds after it; the other client's chat latency (p50, p99)
during the burst; the bytes the receiver got per export after the burst (each metrics export
carries every series, so a series per name makes every later export that much larger).

A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.otlp import OtlpReceiver
from loadtests.harness.procfs import cpu_seconds, rss_bytes
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
ASK = [{"role": "user", "content": "Say hello."}]


def _usage(pid: int, seconds: float) -> tuple[float, float]:
    """(RSS MB at the end, CPU % of a core) over `seconds`."""
    cpu0 = cpu_seconds(pid)
    time.sleep(seconds)
    return rss_bytes([pid]) / 1e6, (cpu_seconds(pid) - cpu0) / seconds * 100


def _burst(gw: GatewayServer, requests: int, kib: int, clients: int) -> None:
    def one(i: int) -> None:
        with gw.client() as c:
            name = f"{i}-" + "m" * (kib * 1024)
            r = c.post("/v1/chat/completions", json={"model": name, "messages": ASK})
            assert r.status_code == 404, r.status_code

    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(requests)))


def _chats(gw: GatewayServer, stop: threading.Event, out: list[float]) -> None:
    body = {"model": "coder", "messages": ASK, "stream": True, "max_tokens": 8}
    with gw.client() as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                r.read()
            out.append(time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.otel_names", description=__doc__)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--kib", type=int, default=1024, help="KiB per model name")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--settle", type=float, default=10.0, help="seconds measured after")
    ap.add_argument("--no-otlp", action="store_true", help="the same gateway without OTLP")
    args = ap.parse_args(argv)
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as sim,
        OtlpReceiver(keep=False) as otlp,
        mock.patch.dict(os.environ, {"OTEL_BSP_SCHEDULE_DELAY": "200"}),
        GatewayServer(
            coder_policy({"coder-a": sim.url}, served=SERVED),
            args=()
            if args.no_otlp
            else ("--otlp-endpoint", otlp.url, "--otlp-metrics-interval", "1"),
            insecure=True,
        ) as gw,
    ):
        assert gw.proc is not None
        pid = gw.proc.pid
        rss, cpu = _usage(pid, 3.0)
        print(f"idle before: RSS {rss:.0f} MB, CPU {cpu:.1f} %")
        stop, latencies = threading.Event(), list[float]()
        other = threading.Thread(target=_chats, args=(gw, stop, latencies))
        other.start()
        cpu0, t0 = cpu_seconds(pid), time.perf_counter()
        _burst(gw, args.requests, args.kib, args.clients)
        took = time.perf_counter() - t0
        stop.set()
        other.join()
        cpu = (cpu_seconds(pid) - cpu0) / took * 100
        print(
            f"burst: {args.requests} x {args.kib} KiB names in {took:.1f} s, RSS"
            f" {rss_bytes([pid]) / 1e6:.0f} MB, CPU {cpu:.0f} %"
        )
        if len(latencies) >= 2:
            q = statistics.quantiles(latencies, n=100)
            print(
                f"other client's chats: {len(latencies)}, p50 {q[49] * 1e3:.1f} ms,"
                f" p99 {q[98] * 1e3:.1f} ms"
            )
        exports0, bytes0 = otlp.requests, otlp.bytes
        rss, cpu = _usage(pid, args.settle)
        exports = otlp.requests - exports0
        per = (otlp.bytes - bytes0) / exports / 1e3 if exports else 0.0
        print(f"after ({args.settle:g} s): RSS {rss:.0f} MB, CPU {cpu:.1f} %")
        print(f"exports after: {exports}, {per:.1f} kB each")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
