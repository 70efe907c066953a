"""A session's attained service (proxy/backends/attained.py): a sliding window of minute
buckets, fed at the end of each request, read by the session table's view, bounded whatever a
replica sends."""

from __future__ import annotations

import pytest

from policies.sessions import SessionId
from proxy.backends.attained import (
    BUCKET_S,
    MAX_BUCKETS,
    AttainedWindow,
    parse_pairs,
    served_tokens,
)
from proxy.backends.session_table import SessionTable


@pytest.mark.parametrize(
    ("prompt", "cached", "completion", "served"),
    [
        (50_000, 46_000, 500, 4_500),  # a turn of a long session: its new tokens and output
        (50_000, None, 500, 50_500),  # the engine did not say what it had cached
        (None, None, 300, 300),  # no usage: the output the relay counted
        (100, 400, 0, 0),  # a count that makes no sense is not negative
    ],
)
def test_served_tokens(prompt, cached, completion, served) -> None:
    assert served_tokens(prompt, cached, completion) == served


def test_window_slides_by_bucket() -> None:
    w = AttainedWindow()
    w.add(1000, 0.0)
    w.add(500, 30.0)  # the same minute's bucket
    w.add(200, 70.0)
    assert len(w.buckets) == 2
    assert w.total(100.0, 600.0) == 1700
    assert w.total(601.0, 600.0) == 200  # the first bucket (begun at 0) left the window
    assert w.total(671.0, 600.0) == 0


def test_window_is_bounded() -> None:
    w = AttainedWindow()
    for minute in range(3 * MAX_BUCKETS):
        w.add(1, minute * BUCKET_S)
    assert len(w.buckets) == MAX_BUCKETS


@pytest.mark.parametrize(
    "value",
    [
        "x",
        [[1.0]],
        [[1.0, -1]],
        [[1.0, 10**30]],
        [[float("nan"), 1]],
        [[True, 1]],
        [[1.0, 1]] * (MAX_BUCKETS + 1),
    ],
)
def test_a_replica_cannot_send_what_is_not_a_window(value) -> None:
    assert parse_pairs(value, 0.0) is None


def test_shared_buckets_move_to_this_clock() -> None:
    assert parse_pairs([[1000.0, 5]], 900.0) == [(100.0, 5)]


def test_table_view_carries_attained_tokens_of_the_policy_window() -> None:
    table = SessionTable()
    sid = SessionId("s-" + "a" * 32, "header", "", False)
    table.placed(sid, "agent", "a", 0.0)
    table.served(sid.key, 4000, 1.0)
    table.served(sid.key, 2000, 200.0)
    assert table.view(sid, 300.0).attained_tokens == 6000
    table.configure(10_000, 1800.0, 120.0)  # a policy with a 2-minute window
    assert table.view(sid, 300.0).attained_tokens == 2000
    table.served("s-unknown", 10, 1.0)  # a session the table does not hold: nothing
    assert table.get("s-unknown") is None
