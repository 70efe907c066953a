"""Session-aware admission's state (proxy/backends/residency.py): residency follows turns, a
waiting session keeps its place across retries for `place_kept_s`, a residency asked to end
while a turn is in flight ends with that turn; the KV tokens an engine reports, and the order
of the KV sources (the policy's, the engine's, the deployed budget's)."""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from loadtests.harness.gateway import coder_policy
from loadtests.harness.ports import free_port
from loadtests.sim.kv_publisher import KvPublisher
from policies.admission import Capacity, Resident, Waiter
from policies.compiled import compile_policy
from policies.schema import load_policy
from proxy.admin.residency_view import residency_rows
from proxy.backends.health import parse_vllm_metrics
from proxy.backends.residency import Residency
from proxy.gateway import Gateway
from proxy.ops.deploy.plan import deployed_kv_tokens
from proxy.relay.hold import capacity
from proxy.settings import Settings


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
    assert r.snapshot("e", 13.0, 60).waiting == (
        Waiter("b", 10.0, False, "", 2.0),
        Waiter("c", 11.0, True, "", 2.0),
    )
    assert r.waiting("e") == 1
    assert r.join("e", "b", 14.0) == 10.0  # the retry: the same place
    # Its wait counts the time a request of it waited, not the time it was away.
    assert r.snapshot("e", 15.0, 60).waiting[0] == Waiter("b", 10.0, True, "", 3.0)
    r.leave("e", "b", 20.0)
    assert [w.key for w in r.snapshot("e", 79.0, 60).waiting] == ["b", "c"]
    assert [w.key for w in r.snapshot("e", 81.0, 60).waiting] == ["c"]  # kept 60 s, no more
    assert r.join("e", "b", 82.0) == 82.0  # too late: the end of the queue
    r.admitted("e", "c", 1)
    assert [w.key for w in r.snapshot("e", 83.0, 60).waiting] == ["b"]


def test_a_kept_place_banks_no_wait_while_absent() -> None:
    r = Residency()
    r.join("e", "b", 0.0, "alice")
    r.leave("e", "b", 5.0)  # its client left after 5 s ...
    r.join("e", "b", 600.0, "alice")  # ... and came back ten minutes later: 6 s waited
    assert r.snapshot("e", 601.0, 3600).waiting == (Waiter("b", 0.0, True, "alice", 6.0),)
    r.join("e", "~1", 602.0)
    r.leave("e", "~1", 603.0, keep=False)  # a request of no session: no retry to keep it for
    assert [w.key for w in r.snapshot("e", 604.0, 3600).waiting] == ["b"]


def test_a_request_counted_on_a_row_of_its_own_ends_with_it() -> None:
    """A compaction of a session not resident here, or a request of no session: its tokens
    count while it runs, not as its session's residency."""
    r = Residency()
    r.join("e", "s", 0.0)
    r.admitted("e", "s", 5000, row="~1")
    assert r.snapshot("e", 1.0, 60).waiting == () and r.resident_tokens("e") == 5000
    _done(r, "~1", 2.0, 6000)
    assert r.snapshot("e", 3.0, 60).residents == ()


def test_which_client_was_served_last() -> None:
    r = Residency()
    for key, client in (("a", "x"), ("b", "y"), ("c", "x"), ("~1", "")):
        r.admitted("e", key, 1, client=client)
    assert dict(r.snapshot("e", 1.0, 60).served) == {"x": 3, "y": 2}


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
    reported = {"kv_tokens": 32768.0, "kv_block_size": 16.0}  # the block: prefix accounting
    assert parse_vllm_metrics(page % "2048", 0.0).values == reported
    assert parse_vllm_metrics(page % "None", 0.0).values == {}  # not profiled yet
    assert parse_vllm_metrics(page % "1e99", 0.0).values == {}


def test_the_kv_tokens_in_order_policy_engine_deployed(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    doc = coder_policy({"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:10"})
    doc["backends"]["a"]["kv_tokens"] = 1000
    config.write_text(yaml.safe_dump(doc))
    policy = compile_policy(load_policy(config))
    gw = Gateway(Settings(config=config, state_dir=tmp_path / "s"), policy)
    assert capacity(gw, policy, "b").kv_tokens is None  # a gateway alone knows no budget
    gw = Gateway(Settings(config=config, state_dir=tmp_path / "s"), policy)
    gw.kv_of = deployed_kv_tokens  # as `specrouter serve` sets it
    deployed = capacity(gw, policy, "b").kv_tokens
    assert deployed is not None and deployed > 100_000  # the GB10 memory model's
    gw.kv_reported["a"] = gw.kv_reported["b"] = 5000
    assert capacity(gw, policy, "a") == Capacity(1000, 16)  # the policy's first
    assert capacity(gw, policy, "b") == Capacity(5000, 16)  # then the engine's
    assert deployed_kv_tokens(load_policy(config).model_copy(update={"backends": {}})) == {}


def test_the_dashboards_rows(tmp_path: Path) -> None:
    config = tmp_path / "p.yaml"
    doc = coder_policy({"a": "http://127.0.0.1:9"})
    doc["backends"]["a"]["kv_tokens"] = 1000
    doc["admission"] = {"sessions": {"enabled": True, "idle_s": 60, "shared_prefix_tokens": 0}}
    config.write_text(yaml.safe_dump(doc))
    gw = Gateway(
        Settings(config=config, state_dir=tmp_path / "s"), compile_policy(load_policy(config))
    )
    now = time.perf_counter()
    gw.residency.admitted("a", "s1", 300)
    gw.residency.admitted("a", "s2", 200)
    gw.residency.turn_done("a", "s2", now - 61, prompt_tokens=None, completion_tokens=None,
                           cached_tokens=None)  # fmt: skip
    gw.residency.join("a", "s3", now - 5)
    gw.residency.waited("a", 42.0, admitted=False)
    [row] = residency_rows(gw)
    assert row == {
        "backend": "a", "enabled": True, "resident": 1, "resident_tokens": 300,
        "kv_tokens": 1000, "waiting": 1, "longest_wait_s": row["longest_wait_s"], "held": 1,
        "timeouts": 1, "longest_ever_s": 42.0,
    }  # fmt: skip
    assert 5.0 <= row["longest_wait_s"] < 10.0


def test_an_idle_resident_counts_its_measured_prefix() -> None:
    """With the engine's KV events, an idle resident counts what the engine holds of it; a
    turn in flight, and a session the events say nothing of, count the estimate."""
    r = Residency()
    held = {("e", "a"): 256}
    r.measured = lambda engine, key: held.get((engine, key))
    r.admitted("e", "a", 500)
    assert r.snapshot("e", 1.0, 60).residents == (Resident("a", 500, None),)  # in flight
    _done(r, "a", 2.0, 1000)
    r.admitted("e", "b", 700)
    _done(r, "b", 2.0, 1000)
    snap = r.snapshot("e", 3.0, 60)
    assert snap.residents == (Resident("a", 256, 2.0), Resident("b", 1010, 2.0))
    assert r.resident_tokens("e") == 256 + 1010


def test_a_gateway_with_kv_events_counts_what_the_engine_holds(tmp_path: Path) -> None:
    """The backend's KV events (a real ZMQ publisher on vLLM's wire) reach admission's
    residents and their tokens: an idle session whose last turn estimated 1,010 tokens counts
    the 3 blocks of 4 tokens the engine says it holds."""
    endpoint, replay = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    config = tmp_path / "p.yaml"
    doc = coder_policy({"a": "http://127.0.0.1:9"})
    doc["backends"]["a"]["kv_events"] = {"endpoint": endpoint, "replay": replay}
    config.write_text(yaml.safe_dump(doc))
    gw = Gateway(
        Settings(config=config, state_dir=tmp_path / "s"), compile_policy(load_policy(config))
    )
    gw.start()
    pub = KvPublisher(endpoint, replay, block_size=4)
    try:
        gw.residency.admitted("a", "s1", 300)
        gw.residency.turn_done("a", "s1", time.perf_counter(), prompt_tokens=1000,
                               completion_tokens=10, cached_tokens=None)  # fmt: skip
        assert (
            gw.residency.snapshot("a", time.perf_counter(), 60).residents[0].prefix_tokens == 1010
        )
        deadline = time.monotonic() + 10
        while gw.kv_resident_tokens("a", "s1") is None:  # a publisher's first batches go
            assert time.monotonic() < deadline  # before its connection is up: sent until read
            pub.stored([1, 2, 3], None, "s1")
            time.sleep(0.02)
        [resident] = gw.residency.snapshot("a", time.perf_counter(), 60).residents
        assert (resident.key, resident.prefix_tokens) == ("s1", 12)
        assert gw.residency.resident_tokens("a") == 12
    finally:
        pub.close()
        gw.kv_engines.close()
