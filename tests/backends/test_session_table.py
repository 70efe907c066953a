"""The session table: placement, turns, bounds, idle expiry, merge from another replica."""

from __future__ import annotations

from policies.sessions import SessionId
from proxy.backends.session_table import MIN_SESSIONS_FOR_MEAN, SessionTable, SharedRow


def sid(n: int, continues: bool = True) -> SessionId:
    return SessionId(f"s-{n:032x}", "header", "", False, continues)


def test_placed_then_finished_builds_the_view() -> None:
    t = SessionTable()
    assert t.view(sid(1), 0.0).engine is None
    t.placed(sid(1), "agent", "a", 1.0)
    t.finished(
        sid(1).key,
        "a",
        2.0,
        prompt_tokens=4000,
        completion_tokens=500,
        cached_tokens=3000,
        decode_s=5.0,
    )
    v = t.view(sid(1), 3.0)
    assert (v.engine, v.prefix_tokens, v.turns, v.out_tokens_per_turn) == ("a", 4500, 1, 500.0)
    assert v.mean_turns is None  # too few sessions for a mean


def test_a_move_forgets_the_prefix_and_counts() -> None:
    t = SessionTable()
    t.placed(sid(1), "agent", "a", 1.0)
    t.finished(
        sid(1).key, "a", 2.0, prompt_tokens=4000, completion_tokens=0, cached_tokens=0, decode_s=0.0
    )
    t.placed(sid(1), "agent", "b", 3.0)
    row = t.get(sid(1).key)
    assert row is not None and (row.engine, row.prefix_tokens, row.moves) == ("b", 0, 1)


def test_bounded_least_recent_dropped_and_mean_kept() -> None:
    t = SessionTable(size=MIN_SESSIONS_FOR_MEAN)
    for n in range(MIN_SESSIONS_FOR_MEAN + 5):
        t.placed(sid(n), "agent", "a", float(n))
        for _ in range(n % 3):
            t.finished(
                sid(n).key,
                "a",
                float(n),
                prompt_tokens=1,
                completion_tokens=1,
                cached_tokens=None,
                decode_s=0.0,
            )
    assert len(t) == MIN_SESSIONS_FOR_MEAN
    assert t.get(sid(0).key) is None and t.get(sid(MIN_SESSIONS_FOR_MEAN + 4).key) is not None
    kept = [n % 3 for n in range(5, MIN_SESSIONS_FOR_MEAN + 5)]
    assert t.mean_turns() == sum(kept) / len(kept)
    assert [k for k, _ in t.recent(2)] == [
        sid(MIN_SESSIONS_FOR_MEAN + 4).key,
        sid(MIN_SESSIONS_FOR_MEAN + 3).key,
    ]


def test_idle_and_fresh_fingerprints_are_new() -> None:
    t = SessionTable(idle_s=60.0)
    t.placed(sid(1), "agent", "a", 0.0)
    assert t.view(sid(1), 30.0).engine == "a"
    assert t.view(sid(1), 61.0).engine is None
    assert t.view(sid(1, continues=False), 1.0).engine is None


def test_merge_takes_newer_rows_only() -> None:
    t = SessionTable()
    changed: list[str] = []
    t.on_change = changed.append
    t.placed(sid(1), "agent", "a", 10.0)
    assert not t.merge(sid(1).key, SharedRow("b", 5.0, 100, 0, 0))
    assert t.view(sid(1), 11.0).engine == "a"
    assert t.merge(sid(1).key, SharedRow("b", 12.0, 100, 3, 900))
    v = t.view(sid(1), 13.0)
    assert (v.engine, v.prefix_tokens, v.turns, v.out_tokens_per_turn) == ("b", 100, 3, 300.0)
    assert changed == [sid(1).key]  # a merge is not a local change: it is not sent back


def test_merge_keeps_the_bound_and_the_mean() -> None:
    t = SessionTable(size=MIN_SESSIONS_FOR_MEAN)
    for n in range(MIN_SESSIONS_FOR_MEAN + 3):
        t.merge(sid(n).key, SharedRow("a", float(n), 0, 2, 0))
    assert len(t) == MIN_SESSIONS_FOR_MEAN and t.get(sid(0).key) is None
    t.merge(sid(5).key, SharedRow("a", 100.0, 0, 22, 0))  # a later turn count replaces ours
    assert t.mean_turns() == (2 * (MIN_SESSIONS_FOR_MEAN - 1) + 22) / MIN_SESSIONS_FOR_MEAN


def test_the_view_takes_the_measured_prefix_where_the_engine_has_events() -> None:
    t = SessionTable()
    t.placed(sid(1), "agent", "a", 1.0)
    t.finished(
        sid(1).key, "a", 2.0, prompt_tokens=4000, completion_tokens=500, cached_tokens=0, decode_s=0
    )
    held = {("a", sid(1).key): 2048}
    t.measured = lambda engine, key: held.get((engine, key))
    assert t.view(sid(1), 3.0).prefix_tokens == 2048  # evicted down to 2,048: what moving costs
    held.clear()  # no events for it: the estimate, as without
    assert t.view(sid(1), 3.0).prefix_tokens == 4500
