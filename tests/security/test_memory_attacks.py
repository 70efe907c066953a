"""Memory per request: bodies built to cost the gateway the most memory per byte, sent
at once through the real gateway over TLS; its resident memory must stay within a stated bound
while they are in flight, and come back after the burst.

The bound (docs/overhead-agents.md, "Memory per request"): a request in flight holds its body
about three times (the bytes read, the parsed strings, the upstream body) plus ~100 bytes per
JSON container it parses, and a body may hold at most `max_json_containers` of them; nothing
is kept once the engine has the request but what the relay still needs. Freed memory goes back
to the system within seconds (proxy/memory.py). Before: four concurrent 8 MiB bodies of empty
objects took the gateway from 82 to 850 MB, and it stayed there.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest

from loadtests.bench.agent_body import agent_body
from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.launch import Child
from loadtests.harness.procfs import rss_bytes
from loadtests.harness.rawhttp import Address
from proxy.certs import CertFiles

MB = 1_000_000
MIB = 1 << 20


@dataclass
class Stack:
    gw: GatewayServer
    target: Address
    pid: int


@pytest.fixture(scope="module")
def stack(certs: CertFiles) -> Iterator[Stack]:
    # The pacer (a vLLM-shaped stream at next to no cost): the engine takes a 5 MB body in
    # milliseconds, so what is measured is the gateway holding it.
    pacer = Child(
        "pacer",
        [sys.executable, "-m", "loadtests.bench.pacer", "--port", "0", "--step-ms", "2"],
        ready=re.compile(r"pacer listening on (http://127\.0\.0\.1:\d+)"),
        detach=True,
    ).start()
    # One client's burst past its body budget (proxy/body_budget.py) waits its turn here
    # rather than getting 503: what is measured is what the admitted requests hold.
    env = pytest.MonkeyPatch()
    env.setenv("SPECROUTER_BODY_BUDGET_WAIT_S", "60")  # inherited by the gateway
    try:
        assert pacer.match is not None
        with GatewayServer(coder_policy({"a": pacer.match.group(1)}), certs=certs) as gw:
            assert gw.proc is not None
            stack = Stack(gw, Address.of(gw.base, certs.ca_cert), gw.proc.pid)
            small = _messages(4096)
            asyncio.run(_post(stack.target, "/v1/messages", small))  # warm: lazy imports, pools
            yield stack
    finally:
        env.undo()
        pacer.stop()


class Peak:
    """The process's RSS, sampled every 10 ms in a thread while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes([self.pid]))
            time.sleep(0.01)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _post(target: Address, path: str, body: bytes) -> int:
    reader, writer = await asyncio.open_connection(
        target.host, target.port, ssl=target.tls, server_hostname=target.host
    )
    try:
        writer.write(
            b"POST %s HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
            b"content-type: application/json\r\nconnection: close\r\ncontent-length: %d\r\n\r\n"
            % (path.encode(), CLIENT_KEY.encode(), len(body))
        )
        writer.write(body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 60)
        answer = await asyncio.wait_for(reader.read(), 60)  # the whole answer, to the close
        del answer
        return int(head.split(b" ", 2)[1])
    finally:
        writer.close()


def _burst(stack: Stack, path: str, body: bytes, n: int) -> tuple[list[int], int]:
    async def go() -> list[int]:
        return await asyncio.gather(*(_post(stack.target, path, body) for _ in range(n)))

    with Peak(stack.pid) as peak:
        statuses = asyncio.run(go())
    return statuses, peak.peak


def _settled(pid: int, at_most: int, within_s: float = 8.0) -> int:
    deadline = time.monotonic() + within_s
    rss = rss_bytes([pid])
    while rss > at_most and time.monotonic() < deadline:
        time.sleep(0.2)
        rss = rss_bytes([pid])
    return rss


def _empty_objects(size: int) -> bytes:
    head = orjson.dumps(
        {"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    n = (size - len(head) - 16) // 3
    return head[:-1] + b',"x":[' + b",".join([b"{}"] * n) + b"]}"


def _messages(size: int) -> bytes:
    body = agent_body("messages", size, model="coder")
    body.update(max_tokens=4)
    return orjson.dumps(body)


SLACK = 32 * MB  # the one parsed tree of the process, buffers, the allocator's pages kept
KEPT = 24 * MB  # may stay after the burst: 16 MiB kept free for reuse (proxy/memory.py), pages

CASES = [
    # name, path, body, concurrent requests, statuses, in-flight bodies allowed per request
    # Refused before the parse (413, `max_json_containers`): what is held is the bytes read.
    ("empty objects, 4 x 8 MiB", "/v1/chat/completions", _empty_objects(8 * MIB - 4096), 4, 413, 2),
    # Parsed, decided, sent on and answered (a stream): while they are read and sent each holds
    # its bytes read, its serialised conversation and the upstream body, never the parsed tree
    # beyond its own decision; nothing of the body while the answer streams.
    ("Messages, 12 x 5 MB", "/v1/messages", _messages(5 * MB), 12, 200, 3),
]


@pytest.mark.parametrize("name,path,body,n,status,copies", CASES, ids=[c[0] for c in CASES])
def test_a_burst_of_large_bodies_stays_bounded_and_memory_comes_back(
    stack: Stack, name: str, path: str, body: bytes, n: int, status: int, copies: int
) -> None:
    before = _settled(stack.pid, 0, within_s=1.0)
    statuses, peak = _burst(stack, path, body, n)
    after = _settled(stack.pid, before + KEPT)
    figures = (
        f"{name}: {len(body) / MB:.1f} MB x {n}: RSS {before / MB:.0f} MB -> peak "
        f"{peak / MB:.0f} MB -> after {after / MB:.0f} MB"
    )
    print(figures)
    assert statuses == [status] * n, figures
    # Before: 4 x 8 MiB of empty objects took the gateway from 85 to 798 MB (their trees
    # alive together); twelve 5 MB Messages bodies from 92 to 300 MB, and 131 MB stayed.
    assert peak - before <= copies * n * len(body) + SLACK, figures
    assert after <= before + KEPT, figures
