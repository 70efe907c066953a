"""One vLLM engine's KV events, received on a thread of their own (never the event loop).

The subscriber binds (vLLM connects out to a `tcp://host:port` endpoint: its publisher binds
only a `tcp://*` wildcard, every interface, which the deploy never renders) and only on a
loopback or private address: the events name every session's blocks. The engine's replay
socket (a ROUTER vLLM binds, on the address the deploy gives it) is asked for a gap from a
DEALER. The decoding, order and index are kv_events.py and kv_index.py; this module is their
sockets. The event loop reads the index under a lock, a dictionary lookup per block.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

import zmq

from policies.spec.kv_events import private_endpoint
from proxy.backends.kv_events import (
    END_SEQ,
    Apply,
    Ask,
    BadBatch,
    Reset,
    Sequencer,
    Step,
    decode,
    seq_of,
)
from proxy.backends.kv_index import KvIndex, Residency

log = logging.getLogger(__name__)
POLL_MS: Final = 100
REPLAY_TIMEOUT_S: Final = 2.0  # without a frame of the replay's answer: what is held goes on


class KvSubscriber:
    """Binds `endpoint`, applies what arrives to `index`; `replay`: the engine's replay
    socket, asked for the batches a gap missed."""

    def __init__(
        self,
        endpoint: str,
        replay: str | None = None,
        topic: str = "",
        name: str = "engine",
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self.endpoint = private_endpoint(endpoint)
        self.replay = None if replay is None else private_endpoint(replay)
        self.topic = topic.encode()
        self.name = name
        self.index = KvIndex()
        self.bound = threading.Event()  # `address` set: the socket listens
        self.address = ""
        self.batches = 0
        self.bad = 0
        self._seq = Sequencer()
        self._count = count or (lambda what, n: None)  # a metric: applied, gap, lost, ...
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait: bool = True) -> None:
        """Ends the thread (within one poll); `wait`: until it has closed its sockets."""
        self._stop.set()
        if wait and self._thread.is_alive():
            self._thread.join(timeout=5)

    def residency(self, session: str) -> Residency | None:
        with self._lock:
            return self.index.residency(session)

    def _run(self) -> None:
        ctx = zmq.Context()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, self.topic)
        sub.setsockopt(zmq.LINGER, 0)
        dealer: zmq.Socket[bytes] | None = None
        try:
            sub.bind(self.endpoint)
            self.address = sub.getsockopt_string(zmq.LAST_ENDPOINT)
            self.bound.set()
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            asked_at = 0.0
            while not self._stop.is_set():
                ready = dict(poller.poll(POLL_MS))
                if sub in ready:
                    frames = sub.recv_multipart()
                    self._steps(frames, self._seq.live)
                if dealer is not None and dealer in ready:
                    asked_at = time.monotonic()  # the replay answers: its timeout starts again
                    frames = dealer.recv_multipart()[1:]  # the empty delimiter
                    if len(frames) == 3 and frames[1] == END_SEQ:
                        self._do(self._seq.replay_end())
                    else:
                        self._steps(frames, self._seq.replayed)
                if self._seq.asked is not None:
                    if dealer is None or time.monotonic() - asked_at > REPLAY_TIMEOUT_S:
                        if dealer is not None:  # no answer: what is held goes on
                            poller.unregister(dealer)
                            dealer.close(linger=0)
                            dealer = None
                            self._do(self._seq.replay_end())
                            continue
                        dealer = self._ask(ctx, self._seq.asked)
                        asked_at = time.monotonic()
                        if dealer is None:
                            self._do(self._seq.replay_end())
                        else:
                            poller.register(dealer, zmq.POLLIN)
                elif dealer is not None:
                    poller.unregister(dealer)
                    dealer.close(linger=0)
                    dealer = None
        except zmq.ZMQError as exc:
            log.error("KV events of %s on %s: %s", self.name, self.endpoint, exc)
        finally:
            self.bound.set()
            sub.close(linger=0)
            if dealer is not None:
                dealer.close(linger=0)
            ctx.term()

    def _ask(self, ctx: zmq.Context[zmq.Socket[bytes]], start: int) -> zmq.Socket[bytes] | None:
        if self.replay is None:
            return None
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay)
        dealer.send_multipart((b"", start.to_bytes(8, "big")))
        return dealer

    def _steps(self, frames: list[bytes], step: Callable[[int, bytes], list[Step]]) -> None:
        if len(frames) != 3:
            self._bad()
            return
        try:
            seq = seq_of(frames[1])
        except BadBatch:
            self._bad()
            return
        self._do(step(seq, frames[2]))

    def _bad(self) -> None:
        self.bad += 1
        self._count("bad", 1)

    def _do(self, steps: list[Step]) -> None:
        for s in steps:
            if isinstance(s, Apply):
                try:
                    events = decode(s.payload)
                except BadBatch:
                    self._bad()
                    continue
                with self._lock:
                    self.index.apply(events)
                self.batches += 1
                self._count("applied", 1)
            elif isinstance(s, Reset):
                with self._lock:
                    self.index.reset("lost" if s.why == "lost" else "engine-restart")
                self._count("lost" if s.why == "lost" else "restart", 1)
            elif isinstance(s, Ask):  # the loop opens the replay request (`Sequencer.asked`)
                self._count("gap", 1)
