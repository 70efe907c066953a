"""Session-aware admission's state (proxy/backends/residency.py): residency follows turns, a
waiting session keeps its place across retries for `place_kept_s`, a residency asked to end
while a turn is in flight ends with that turn; and the KV tokens an engine reports."""

from __future__ import annotations

from policies.admission import Resident, Waiter
from proxy.backends.health import parse_vllm_metrics
from proxy.backends.residency import Residency


def _done(r: Residency, key: str, now: float, prompt: int, cached: int = 0) -> None:
    r.turn_done("e", key, now, prompt_tokens=prompt, completion_tokens=10, cached_tokens=cached)


def test_residency_follows_turns_and_learns_the_shared_prefix() -> None:
    seen: list[tuple[str, int, int]] = []
    r = Residency(lambda *a: seen.append(a))
    r.admitted("e", "a", 500)
    assert r.snapshot("e", 1.0, 60).residents == (Resident("a", 500, None),)
    _done(r, "a", 2.0, 1000, cached=300)  # a new session's hits: the shared prefix
    snap = r.snapshot("e", 3.0, 60)
    assert snap.residents == (Resident("a", 1010, 2.0),) and snap.shared_prefix_tokens == 300
    r.admitted("e", "a", 10)
    _done(r, "a", 4.0, 2000, cached=1900)  # a later turn's hits are its own prefix
    assert r.snapshot("e", 5.0, 60).shared_prefix_tokens == 300
    r.admitted("e", "b", 1000)
    assert r.resident_tokens("e") == 2010 + 1000 - 300
    assert seen[-1] == ("e", 2, 2710)


def test_a_place_is_kept_across_retries_then_dropped() -> None:
    r = Residency()
    assert r.join("e", "b", 10.0) == 10.0
    assert r.join("e", "c", 11.0) == 11.0
    r.leave("e", "b", 12.0)  # b's client gave up: its place stays, blocking nobody
    assert r.snapshot("e", 13.0, 60).waiting == (Waiter("b", 10.0, False), Waiter("c", 11.0))
    assert r.waiting("e") == 1
    assert r.join("e", "b", 14.0) == 10.0  # the retry: the same place
    assert r.snapshot("e", 15.0, 60).waiting[0] == Waiter("b", 10.0, True)
    r.leave("e", "b", 20.0)
    assert [w.key for w in r.snapshot("e", 79.0, 60).waiting] == ["b", "c"]
    assert [w.key for w in r.snapshot("e", 81.0, 60).waiting] == ["c"]  # kept 60 s, no more
    assert r.join("e", "b", 82.0) == 82.0  # too late: the end of the queue
    r.admitted("e", "c", 1)
    assert [w.key for w in r.snapshot("e", 83.0, 60).waiting] == ["b"]


def test_a_residency_ended_during_a_turn_ends_with_it() -> None:
    r = Residency()
    r.admitted("e", "a", 100)
    r.admitted("e", "b", 100)
    _done(r, "b", 1.0, 100)
    r.end("e", ["a", "b"])
    assert [x.key for x in r.snapshot("e", 2.0, 60).residents] == ["a"]  # in flight
    _done(r, "a", 3.0, 200)
    assert r.snapshot("e", 4.0, 60).residents == ()
    r.admitted("e", "c", 100)
    r.compacted("e", "c")  # a compaction while c's turn runs: its prefix is replaced
    r.admitted("e", "c", 100)  # ... unless it is admitted again meanwhile
    _done(r, "c", 5.0, 100)
    _done(r, "c", 6.0, 100)
    assert [x.key for x in r.snapshot("e", 7.0, 60).residents] == ["c"]


def test_the_kv_tokens_an_engine_reports() -> None:
    page = (
        "# TYPE vllm:cache_config_info gauge\n"
        'vllm:cache_config_info{block_size="16",num_gpu_blocks="%s",engine="0"} 1.0\n'
    )
    assert parse_vllm_metrics(page % "2048", 0.0).values == {"kv_tokens": 32768.0}
    assert parse_vllm_metrics(page % "None", 0.0).values == {}  # not profiled yet
    assert parse_vllm_metrics(page % "1e99", 0.0).values == {}
