"""vLLM's KV events read (proxy/backends/kv_events.py), their order (`Sequencer`) and one
engine's index of them (proxy/backends/kv_index.py): tables, no I/O."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from proxy.backends.kv_events import (
    Apply,
    Ask,
    BadBatch,
    Cleared,
    Removed,
    Reset,
    Sequencer,
    Stored,
    decode,
    seq_of,
)
from proxy.backends.kv_index import KvIndex


def batch(*events: Any) -> bytes:
    return msgspec.msgpack.encode([1.5, list(events)])


def stored(hashes: list[Any], parent: Any = None, session: str | None = None) -> dict[str, Any]:
    out = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent}
    out |= {"token_ids": list(range(4 * len(hashes))), "block_size": 4, "medium": "GPU"}
    return out | ({"session_id": session} if session else {})


@pytest.mark.parametrize(
    ("payload", "want"),
    [
        # 0.32.0's maps, default-valued fields absent
        (batch(stored([b"a", b"b"], None, "s-1")), [Stored((b"a", b"b"), None, 4, "s-1")]),
        (batch(stored([7], 6)), [Stored((7,), 6, 4, None)]),
        (batch({"type": "BlockRemoved", "block_hashes": [b"a"]}), [Removed((b"a",))]),
        (batch({"type": "AllBlocksCleared"}), [Cleared()]),
        # the array form of releases before the maps: the tag first
        (
            batch(["BlockStored", [1, 2], None, [0] * 8, 4, None, "GPU"]),
            [Stored((1, 2), None, 4, None)],
        ),
        (batch(["BlockRemoved", [1], "GPU"], ["AllBlocksCleared"]), [Removed((1,)), Cleared()]),
        # a kind this reader does not know is left out
        (batch({"type": "SomethingNew"}, {"type": "AllBlocksCleared"}), [Cleared()]),
    ],
)
def test_decode(payload: bytes, want: list[Any]) -> None:
    assert decode(payload) == want


@pytest.mark.parametrize(
    "payload",
    [b"\xc1", msgspec.msgpack.encode({"ts": 1}), batch({"type": "BlockStored", "block_hashes": 3})],
)
def test_decode_refuses_what_is_not_a_batch(payload: bytes) -> None:
    with pytest.raises(BadBatch):
        decode(payload)


def test_seq_of() -> None:
    assert seq_of((5).to_bytes(8, "big")) == 5
    assert seq_of((-1).to_bytes(8, "big", signed=True)) == -1
    with pytest.raises(BadBatch):
        seq_of(b"\x00")


# Each row: what arrives (live seq, replayed seq, or the replay's end) -> the steps.
L, R, END = "live", "replay", "end"
P = b"p"


@pytest.mark.parametrize(
    ("arrivals", "want"),
    [
        ([(L, 0), (L, 1)], [Apply(P), Apply(P)]),
        # the gateway started after the engine: what is buffered is asked for first
        ([(L, 3), (R, 0), (R, 1), (R, 2), (R, 3), (END, 0)], [Ask(0), *[Apply(P)] * 4]),
        # a gap: asked, live batches held meanwhile, then applied in order
        (
            [(L, 0), (L, 3), (L, 4), (R, 1), (R, 2), (R, 3), (END, 0)],
            [Apply(P), Ask(1), Apply(P), Apply(P), Apply(P), Apply(P)],
        ),
        # the replay no longer holds batch 1: the index starts again
        ([(L, 0), (L, 3), (R, 2), (END, 0)], [Apply(P), Ask(1), Reset("lost"), Apply(P), Apply(P)]),
        # a replay that answers nothing (timeout): the held batches, the gap counted lost
        ([(L, 0), (L, 2), (END, 0)], [Apply(P), Ask(1), Reset("lost"), Apply(P)]),
        # the sequence goes back: a new engine process
        ([(L, 0), (L, 1), (L, 0)], [Apply(P), Apply(P), Reset("engine-restart"), Apply(P)]),
        (
            [
                (L, 0),
                (L, 5),
                (R, 1),
                (R, 2),
                (R, 3),
                (R, 4),
                (END, 0),
                (L, 6),
                (L, 2),
                (R, 0),
                (R, 1),
                (END, 0),
            ],
            [
                Apply(P),
                Ask(1),
                *[Apply(P)] * 5,
                Apply(P),
                Reset("engine-restart"),
                Ask(0),
                Apply(P),
                Apply(P),
                Apply(P),
            ],
        ),
        # a replayed batch already applied is not applied twice
        ([(L, 0), (L, 2), (R, 0), (R, 1), (END, 0)], [Apply(P), Ask(1), Apply(P), Apply(P)]),
    ],
)
def test_sequencer(arrivals: list[tuple[str, int]], want: list[Any]) -> None:
    s = Sequencer()
    got: list[Any] = []
    for kind, seq in arrivals:
        if kind == L:
            got += s.live(seq, P)
        elif kind == R:
            got += s.replayed(seq, P)
        else:
            got += s.replay_end()
    assert got == want


def _index(*events: Any) -> KvIndex:
    index = KvIndex()
    for e in events:
        index.apply(decode(batch(e)))
    return index


@pytest.mark.parametrize(
    ("events", "session", "want"),
    [
        # a first turn, then its next extending it (only the new blocks are reported)
        ([stored([1, 2], None, "a"), stored([3], 2, "a")], "a", (3, 3, 0)),
        # a shared system prompt stored by another session heads the chain
        ([stored([1, 2], None, "a"), stored([5, 6], 2, "b")], "b", (4, 4, 0)),
        # the tail evicted: the run ends before it
        (
            [stored([1, 2, 3], None, "a"), {"type": "BlockRemoved", "block_hashes": [3]}],
            "a",
            (2, 3, 0),
        ),
        # a block removed mid-chain breaks the run there, whatever follows
        (
            [stored([1, 2, 3], None, "a"), {"type": "BlockRemoved", "block_hashes": [2]}],
            "a",
            (1, 3, 0),
        ),
        # a cleared cache: nothing resident, one reset since the chain
        ([stored([1, 2], None, "a"), {"type": "AllBlocksCleared"}], "a", (0, 2, 1)),
        # stored after a parent the index never saw: no run from the first block
        ([stored([8, 9], 7, "a")], "a", (0, 3, 0)),
        # untagged blocks (0.28.0) name no session
        ([stored([1, 2])], "a", None),
    ],
)
def test_index_residency(
    events: list[Any], session: str, want: tuple[int, int, int] | None
) -> None:
    got = _index(*events).residency(session)
    if want is None:
        assert got is None
    else:
        assert got is not None and (got.blocks, got.chain, got.resets) == want
        assert got.tokens == got.blocks * 4


def test_index_keeps_no_token_ids_and_bounded_sessions() -> None:
    index = KvIndex(sessions_max=2)
    for i, s in enumerate("abc"):
        index.apply(decode(batch(stored([10 * i + 1], None, s))))
    assert index.residency("a") is None and index.residency("c") is not None
    assert all(isinstance(v, int | type(None)) for v in index.parent.values())
    index.reset("lost")
    assert (index.lost, index.resets, len(index)) == (1, 0, 0)


def test_index_residency_walked_again_after_a_removal_only() -> None:
    """A run read once is walked on from where it stopped: it grows as blocks come back, and
    shrinks when one is removed, as a fresh walk would say."""
    index = _index(stored([1, 2], None, "b"), stored([3, 4], 2, "a"))
    assert _blocks(index, "a") == 4
    index.apply(decode(batch({"type": "BlockRemoved", "block_hashes": [2]})))
    assert _blocks(index, "a") == 1
    index.apply(decode(batch(stored([2], 1, "b"))))  # b stores the shared block again
    assert _blocks(index, "a") == 4
    index.apply(decode(batch({"type": "BlockRemoved", "block_hashes": [4]})))
    assert _blocks(index, "a") == 3
    index.reset("engine-reset")
    assert _blocks(index, "a") == 0


def _blocks(index: KvIndex, session: str) -> int:
    got = index.residency(session)
    assert got is not None
    return got.blocks
