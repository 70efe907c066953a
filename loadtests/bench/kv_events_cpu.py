"""What the KV events subscriber costs the gateway's process: `python -m loadtests.bench.
kv_events_cpu [--batches N] [--blocks B] [--block-size S]`.

A publisher process sends N batches as vLLM does (loadtests/sim/kv_publisher.py's structs, each
`BlockStored` carrying B hashes and B x S token ids, as a prefill of B blocks does, then a
`BlockRemoved` of as many), to a `KvSubscriber` (proxy/backends/kv_subscriber.py) in this process;
prints this process's CPU seconds over the run, per batch and per block. A benchmark, not a
test: the figures depend on the machine (and its load).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time

import msgspec
import zmq

from loadtests.sim.kv_publisher import BlockRemoved, BlockStored, EventBatch
from proxy.backends.kv_subscriber import KvSubscriber


def _publish(address: str, batches: int, blocks: int, block_size: int) -> None:
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    pub.connect(address)
    time.sleep(0.5)  # the connection up before the first batch (a benchmark, not a test)
    enc = msgspec.msgpack.Encoder()
    tokens = list(range(blocks * block_size))
    seq = 0
    for i in range(batches):
        hashes: list[bytes | int] = [i * blocks + j for j in range(blocks)]
        for event in (
            BlockStored(hashes, None, tokens, block_size, None, "GPU", None, session_id=f"s-{i}"),
            BlockRemoved(hashes, "GPU"),
        ):
            payload = enc.encode(EventBatch(time.time(), [event], 0))
            pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
            seq += 1
    time.sleep(0.5)
    pub.close(linger=1000)
    ctx.term()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=5000)
    p.add_argument("--blocks", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    a = p.parse_args()
    sub = KvSubscriber("tcp://127.0.0.1:*", name="bench")
    sub.start()
    assert sub.bound.wait(5)
    before, t0 = os.times(), time.monotonic()
    proc = multiprocessing.Process(
        target=_publish, args=(sub.address, a.batches, a.blocks, a.block_size)
    )
    proc.start()
    deadline = time.monotonic() + 300
    while sub.batches < 2 * a.batches and time.monotonic() < deadline:
        time.sleep(0.05)
    after, wall = os.times(), time.monotonic() - t0
    proc.join()
    sub.stop()
    cpu = (after.user - before.user) + (after.system - before.system)
    n = sub.batches
    print(
        f"{n} batches ({a.blocks} blocks of {a.block_size} tokens each) in {wall:.1f} s wall: "
        f"{cpu:.2f} CPU s in the subscriber's process, {1e6 * cpu / max(1, n):.0f} us a batch, "
        f"{1e6 * cpu / max(1, n * a.blocks):.2f} us a block"
    )


if __name__ == "__main__":
    main()
