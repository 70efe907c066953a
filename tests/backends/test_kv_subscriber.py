"""The KV events subscriber's sockets (proxy/backends/kv_subscriber.py) against a real ZMQ
publisher speaking vLLM's wire (loadtests/sim/kv_publisher.py, vLLM 0.32.0's publisher's
sockets and frames): it binds on loopback only, fills a gap from the replay socket, and reads
a new publisher's sequence as an engine restart."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator

import pytest

from loadtests.sim.kv_publisher import KvPublisher
from policies.spec.kv_events import private_endpoint
from proxy.backends.kv_subscriber import KvSubscriber


@pytest.mark.parametrize(
    ("endpoint", "ok"),
    [
        ("tcp://127.0.0.1:5557", True),
        ("tcp://10.0.0.5:5557", True),
        ("tcp://[::1]:5557", True),
        ("tcp://127.0.0.1:*", True),
        ("tcp://*:5557", False),  # every interface
        ("tcp://0.0.0.0:5557", False),
        ("tcp://8.8.8.8:5557", False),  # a public address
        ("tcp://engine.local:5557", False),  # a name resolves to anything
        ("ipc:///tmp/kv", False),
        ("tcp://127.0.0.1", False),
    ],
)
def test_endpoint_is_loopback_or_private(endpoint: str, ok: bool) -> None:
    if ok:
        assert private_endpoint(endpoint) == endpoint
    else:
        with pytest.raises(ValueError):
            private_endpoint(endpoint)


def _until(pred: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "not reached"
        time.sleep(0.01)


@pytest.fixture
def sub() -> Iterator[KvSubscriber]:
    with socket.socket() as probe:  # a free port for the replay socket both publishers bind
        probe.bind(("127.0.0.1", 0))
        replay = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    s = KvSubscriber("tcp://127.0.0.1:*", replay, name="t")
    s.start()
    assert s.bound.wait(5) and s.address
    yield s
    s.stop()


def test_gap_filled_from_replay_and_restart_seen(sub: KvSubscriber) -> None:
    assert sub.replay is not None
    pub = KvPublisher(sub.address, sub.replay, block_size=4)
    try:
        # published before the connection is up, so lost live: the replay gives them back
        pub.stored([1, 2], None, "s-a")
        pub.stored([3], 2, "s-a")
        # another session's turns: the sequence well past what a restart could drop unseen, and
        # on until one arrives live (on a loaded machine the connection can come up after the
        # first 40, and the gap shows only to a batch received)
        for i in range(1000):
            if i >= 40 and sub.residency("s-x") is not None:
                break
            pub.stored([100 + i], None, "s-x")
            time.sleep(0.02 if i >= 40 else 0)
        _until(lambda: (r := sub.residency("s-a")) is not None and r.blocks == 3)
        pub.skip(1)
        pub.removed([3])  # never sent live: only the replay has it
        pub.stored([9], None, "s-b")
        _until(lambda: sub.residency("s-b") is not None)
        got = sub.residency("s-a")
        assert got is not None and (got.blocks, got.chain, got.resets) == (2, 3, 0)
    finally:
        pub.close()
    # a new engine process: its sequence starts from 0 again (sent until one arrives: a
    # publisher's first batches go before its connection is up)
    pub = KvPublisher(sub.address, sub.replay, block_size=4)
    try:
        for i in range(20):
            pub.stored([50 + i], None, "s-c")
            if sub.residency("s-c") is not None:
                break
            time.sleep(0.02)
        _until(lambda: sub.residency("s-c") is not None)
        got = sub.residency("s-a")
        assert got is not None and (got.blocks, got.resets) == (0, 1)
        assert sub.index.resets == 1 and sub.bad == 0
    finally:
        pub.close()
