"""What the request log costs: `python -m loadtests.bench.requestlog [--calls N] [--rounds R]`.

1. `RequestLog.sink` on the request path, call by call (perf_counter_ns, the timer's own cost
   subtracted), on finished streaming records of `--tokens` tokens. The garbage collector stays
   on: a gen-0 collection that the sink's tuple triggers is a cost the request really pays.
   Address: under 20 us per record.
2. The background writer: records per second through `flush` (row building and one SQLite
   transaction per batch, in the worker thread), and how late a 1 ms timer on the event loop
   fires meanwhile: the thread shares the GIL with the loop.

Prints medians, p99 and each round's figure with the run counts. A benchmark, not a test: the
figures depend on the machine and its disk.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from proxy.observe.requestlog import RequestLog
from proxy.record.measure import Measurement
from proxy.record.request import RequestRecord

TARGET_US = 20.0


def make_record(i: int, tokens: int, rng: random.Random) -> RequestRecord:
    """A finished streaming request whose Measurement was fed like the relay feeds it."""
    m = Measurement(t_start=0.0)
    m.t_first_byte = now = 0.2 + rng.random() * 0.1
    m.record_usage({"prompt_tokens": 2000, "prompt_tokens_details": {"cached_tokens": 1024}})
    total = 1
    m.record_tokens(total, now)
    while total < tokens:
        total += rng.choice((1, 2, 3, 4))  # tokens accepted per step, speculative decoding
        now += 0.02 + rng.random() * 0.01
        m.record_tokens(total, now)
    m.t_end, m.finish_reason = now, "stop"
    return RequestRecord(
        request_id=f"req-{i}",
        client="alice",
        endpoint="/v1/chat/completions",
        route="coder",
        backend="eagle3",
        reason="rule:quiet",
        content_class="code",
        temperature=0.7,
        temperature_defaulted=True,
        stream=True,
        status=200,
        concurrency=1 + i % 8,
        policy_version="v1",
        m=m,
    )


def _timer_cost_ns(samples: int = 100_000) -> float:
    clock = time.perf_counter_ns
    deltas = []
    for _ in range(samples):
        t0 = clock()
        deltas.append(clock() - t0)
    return float(statistics.median(deltas))


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def bench_sink(
    records: list[RequestRecord], calls: int, rounds: int, drain: int
) -> tuple[list[float], list[float], list[float]]:
    """Per-call times in microseconds (all rounds), each round's median and p99.

    The buffer is emptied every `drain` calls, as the writer does every batch interval: a
    buffer that only grows would make the collector's full passes (and so the tail) longer
    than any gateway sees.
    """
    clock = time.perf_counter_ns
    overhead = _timer_cost_ns()
    every: list[float] = []
    medians: list[float] = []
    p99s: list[float] = []
    log = RequestLog(Path("unused"), max_buffered=drain)  # never started: no I/O at all
    for r in range(rounds + 1):  # the first round warms the interpreter's specialisations
        times = []
        for i in range(calls):
            if i % drain == 0:
                log = RequestLog(Path("unused"), max_buffered=drain)
            record = records[i % len(records)]
            sink = log.sink
            t0 = clock()
            sink(record)
            times.append((clock() - t0 - overhead) / 1000.0)
        assert log.dropped == 0
        if r:
            every += times
            medians.append(statistics.median(times))
            p99s.append(_p99(times))
    return every, medians, p99s


async def _loop_lag(stop: asyncio.Event, lags: list[float]) -> None:
    """How late a 1 ms sleep wakes up: what the writer thread takes from the event loop."""
    while not stop.is_set():
        t0 = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append((time.perf_counter() - t0 - 0.001) * 1000.0)


async def bench_writer(
    records: list[RequestRecord], batch: int, batches: int, directory: Path
) -> tuple[float, list[float]]:
    """Records per second through flush(), and the event loop's timer lags (ms) meanwhile."""
    log = RequestLog(directory / "bench.sqlite3", max_buffered=batch)
    stop, lags = asyncio.Event(), list[float]()
    lagger = asyncio.create_task(_loop_lag(stop, lags))
    t0 = time.perf_counter()
    for b in range(batches):
        for i in range(batch):
            log.sink(records[(b * batch + i) % len(records)])
        await log.flush()
    elapsed = time.perf_counter() - t0
    stop.set()
    await lagger
    await log.stop()
    assert log.written == batch * batches and log.write_errors == 0, (log.written, log.dropped)
    return log.written / elapsed, lags


async def idle_lag(seconds: float) -> list[float]:
    """The same timer with no writer: the machine's own scheduling noise, to subtract by eye."""
    stop, lags = asyncio.Event(), list[float]()
    lagger = asyncio.create_task(_loop_lag(stop, lags))
    await asyncio.sleep(seconds)
    stop.set()
    await lagger
    return lags


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50_000, help="sink calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=512, help="completion tokens per record")
    parser.add_argument(
        "--batch",
        type=int,
        default=2_000,
        help="records per writer batch (2000 per 0.5 s: 4000 requests/s)",
    )
    parser.add_argument("--batches", type=int, default=10, help="writer batches per round")
    parser.add_argument(
        "--idle", type=float, default=2.0, help="seconds of baseline timer lag with no writer"
    )
    args = parser.parse_args(argv)
    rng = random.Random(5)
    records = [make_record(i, args.tokens, rng) for i in range(1_000)]

    every, medians, p99s = bench_sink(records, args.calls, args.rounds, args.batch)
    print(f"sink(), {args.rounds} rounds x {args.calls} calls, records of {args.tokens} tokens:")
    over = sum(1 for t in every if t > TARGET_US)
    print(
        f"  median {statistics.median(every):.2f} us, p99 {_p99(every):.2f} us, "
        f"p99.9 {statistics.quantiles(every, n=1000)[998]:.2f} us, max {max(every):.1f} us; "
        f"{over} of {len(every)} calls over the {TARGET_US:.0f} us target"
    )
    print(
        f"  per-round medians {min(medians):.2f}–{max(medians):.2f} us, "
        f"p99s {min(p99s):.2f}–{max(p99s):.2f} us"
    )

    rates: list[float] = []
    all_lags: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rate, lags = asyncio.run(_writer_round(records, args, Path(tmp), r))
            rates.append(rate)
            all_lags += lags
    print(f"writer, {args.rounds} rounds x {args.batches} batches of {args.batch} records:")
    print(
        f"  {statistics.median(rates):,.0f} records/s median, "
        f"rounds {min(rates):,.0f}–{max(rates):,.0f}"
    )
    idle = asyncio.run(idle_lag(args.idle))
    for label, lags in (("while writing", all_lags), ("idle (baseline)", idle)):
        print(
            f"  event-loop 1 ms timer lag {label}: median {statistics.median(lags):.2f} ms, "
            f"p99 {_p99(lags):.2f} ms, max {max(lags):.2f} ms ({len(lags)} samples)"
        )
    return 0 if statistics.median(every) < TARGET_US else 1


async def _writer_round(
    records: list[RequestRecord], args: argparse.Namespace, tmp: Path, r: int
) -> tuple[float, list[float]]:
    directory = tmp / str(r)
    directory.mkdir()
    return await bench_writer(records, args.batch, args.batches, directory)


if __name__ == "__main__":
    sys.exit(main())
