"""What OpenTelemetry costs per request: `python -m loadtests.bench.otel [--requests N] [--rounds R]`.

The gateway's two calls on the request path, `Telemetry.begin` (the span opened when the request
is decided) and `Telemetry.sink` (attributes, span end, seven histograms, where the request is
finished), on finished streaming records of `--tokens` tokens fed as the relay feeds them
(loadtests/bench/requestlog.py's `make_record`), exporting over real OTLP/HTTP to a receiver
process on loopback (loadtests/harness/otlp.py) with the SDK's default batching.

Per round: the wall time of the two calls per request on this thread (perf_counter_ns), and the
process CPU per request over the round and its export (utime + stime of this process, so the
SDK's export threads, encoding included, count; the receiver's own CPU does not). Divided by the
chunks of a response, that CPU is what OpenTelemetry adds per relayed chunk; the gateway's
per-chunk path itself is untouched (nothing is called per chunk).

A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time

from loadtests.bench.requestlog import make_record
from loadtests.harness.gateway import coder_policy
from loadtests.harness.launch import Child
from policies.compiled import compile_policy
from policies.loading import validate_policy
from proxy.gateway import PolicyHolder
from proxy.observe.otel import Telemetry
from proxy.operator import Operator


def one_round(telemetry: Telemetry, n: int, tokens: int, seed: int) -> tuple[float, float]:
    """(median wall us of begin + sink, CPU us per request including the export)."""
    rng = random.Random(seed)
    records = [make_record(i, tokens, rng) for i in range(n)]
    backend = next(iter(telemetry.policy.current.backends))
    headers = {b"traceparent": b"00-" + b"ab" * 16 + b"-" + b"cd" * 8 + b"-01"}
    walls: list[float] = []
    cpu0 = time.process_time()
    for record in records:
        record.backend, record.model, record.endpoint = backend, "coder", "chat"
        t0 = time.perf_counter_ns()
        telemetry.begin(record, headers)
        telemetry.sink(record)
        walls.append((time.perf_counter_ns() - t0) / 1000)
    telemetry.flush(timeout_s=30)
    cpu = (time.process_time() - cpu0) / n * 1e6
    return statistics.median(walls), cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.otel", description=__doc__)
    ap.add_argument("--requests", type=int, default=2000, help="requests per round")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=115, help="output tokens per request")
    args = ap.parse_args(argv)
    operator = Operator()
    doc = validate_policy(coder_policy({"coder-a": "http://127.0.0.1:9"}), operator.context)
    holder = PolicyHolder(compile_policy(doc), operator.context)
    receiver = Child(
        "otlp",
        [sys.executable, "-m", "loadtests.harness.otlp"],
        ready=re.compile(r"otlp receiver on (http://127\.0\.0\.1:\d+)"),
    ).start()
    try:
        assert receiver.match is not None
        telemetry = Telemetry(receiver.match.group(1), holder, metrics_interval_s=1.0)
        # Warm-up (imports, first connection), fewer for a smoke run's few requests only.
        one_round(telemetry, min(200, args.requests * 10), args.tokens, seed=0)
        results = [one_round(telemetry, args.requests, args.tokens, r) for r in range(args.rounds)]
        telemetry.shutdown()
    finally:
        receiver.stop()
    chunks = len(make_record(0, args.tokens, random.Random(0)).m.step_tokens) + 1
    walls, cpus = [w for w, _ in results], [c for _, c in results]
    print(
        f"OpenTelemetry per request, {args.rounds} rounds x {args.requests} requests of "
        f"{args.tokens} tokens (~{chunks} chunks):"
    )
    print(
        f"  begin + sink on the loop: median {statistics.median(walls):.1f} us "
        f"(rounds {', '.join(f'{w:.1f}' for w in walls)})"
    )
    print(
        f"  CPU incl. export threads: median {statistics.median(cpus):.1f} us "
        f"(rounds {', '.join(f'{c:.1f}' for c in cpus)}), "
        f"{statistics.median(cpus) / chunks:.2f} us per chunk"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
