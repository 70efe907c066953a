"""Mid-stream continuation: an engine dies mid-answer, another variant finishes it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import orjson
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles
from tests.relay.scripted_engine import ScriptedEngine
from tests.stacks import Stacks

SERVED = "qwen3.8-27b"


def _frames(body: bytes) -> list[bytes]:
    return [f for f in body.split(b"\n\n") if f]


@pytest.mark.parametrize("relay", ["push", "pull"])
def test_a_dead_engine_mid_stream_is_continued_in_the_same_stream(certs, relay) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as shallow,
    ):
        policy = coder_policy({"deep": deep.url, "shallow": shallow.url})
        policy["routes"]["coder"]["continuation"] = True
        with GatewayServer(policy, certs=certs, args=("--relay", relay)) as gw:
            deep.fault("die_mid_stream", after_chunks=6)
            with (
                gw.client() as c,
                c.stream(
                    "POST",
                    "/v1/chat/completions",
                    json={
                        "model": "coder",
                        "stream": True,
                        "max_tokens": 120,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                        "messages": [{"role": "user", "content": "Write `util.py`."}],
                    },
                ) as r,
            ):
                assert r.headers["x-specrouter-variant"] == "deep"
                body = r.read()
            frames = _frames(body)
            assert frames[-1] == b"data: [DONE]"
            assert body.count(b"data: [DONE]") == 1 and b'"error"' not in body
            chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
            assert len({ch["id"] for ch in chunks}) == 1
            assert len({ch["created"] for ch in chunks}) == 1
            assert all(ch["model"] == "coder" for ch in chunks)
            roles = [ch for ch in chunks if ch["choices"] and "role" in ch["choices"][0]["delta"]]
            assert len(roles) == 1
            # Token counts carry on across the splice and the answer is complete.
            counts = [ch["usage"]["completion_tokens"] for ch in chunks if ch.get("usage")]
            assert counts == sorted(counts) and counts[-1] <= 120
            finishes = [
                ch["choices"][0]["finish_reason"]
                for ch in chunks
                if ch["choices"] and ch["choices"][0]["finish_reason"]
            ]
            assert finishes == ["length"] or finishes == ["stop"]
            metrics = gw.metrics()
            assert re.search(
                r'specrouter_continuations_total\{from_backend="deep",'
                r'route="coder",to_backend="shallow"\} 1',
                metrics,
            )
            assert 'outcome="ok"' in metrics


def test_the_openai_sdk_reads_one_answer(certs) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as shallow,
    ):
        policy = coder_policy({"deep": deep.url, "shallow": shallow.url})
        policy["routes"]["coder"]["continuation"] = True
        with GatewayServer(policy, certs=certs) as gw:
            deep.fault("die_mid_stream", after_chunks=4)
            stream = gw.openai().chat.completions.create(
                model="coder",
                stream=True,
                max_tokens=80,
                messages=[{"role": "user", "content": "Write `util.py`."}],
            )
            chunks = list(stream)
            text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
            assert text and chunks[-1].choices[0].finish_reason in {"stop", "length"}


def test_no_continuation_for_several_choices(certs) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as deep,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.05) as shallow,
    ):
        policy = coder_policy({"deep": deep.url, "shallow": shallow.url})
        policy["routes"]["coder"]["continuation"] = True
        with GatewayServer(policy, certs=certs) as gw:
            deep.fault("die_mid_stream", after_chunks=4)
            with gw.client() as c:
                r = c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "coder",
                        "stream": True,
                        "max_tokens": 200,
                        "n": 2,
                        "messages": [{"role": "user", "content": "x"}],
                    },
                )
            frames = _frames(r.content)
            assert frames[-1] == b"data: [DONE]" and frames[-2].startswith(b'data: {"error"')


# -- a stop string across the splice (a scripted engine: real ones cannot be made to split it) ----

HEIR_REST = [" and", " more"] * 60


@contextmanager
def _splice_stack(
    certs: CertFiles, relay: str
) -> Iterator[tuple[ScriptedEngine, ScriptedEngine, GatewayServer]]:
    with (
        ScriptedEngine([]) as victim,
        ScriptedEngine([]) as heir,
    ):
        doc = coder_policy({"victim": victim.url, "heir": heir.url}, served="tiny", defaults={})
        for backend in doc["backends"].values():
            backend["kind"] = "llamacpp"
        doc["routes"]["coder"]["continuation"] = True
        with GatewayServer(doc, certs=certs, args=("--relay", relay)) as gw:
            yield victim, heir, gw


def _health(gw: GatewayServer, name: str) -> str:
    snap = gw.admin_get("/dashboard/snapshot").json()
    return str(next(b["health"] for b in snap["backends"] if b["name"] == name))


def _wait(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.05)


@pytest.mark.parametrize("relay", ["push", "pull"])
@pytest.mark.parametrize(
    ("heir_first", "text"),
    [
        (["ld"], "Hello wor"),  # the stop completes in the continuation's first delta
        (["l", "d"], "Hello wor"),  # over two deltas: the first is held, then dropped
        (["l", "y"], None),  # a held beginning that does not complete: relayed after all
    ],
)
def test_a_stop_string_straddling_the_splice_ends_the_answer(
    certs, stacks: Stacks, relay: str, heir_first: list[str], text: str | None
) -> None:
    stop = "world"
    # One gateway per relay over two scripted engines, re-scripted by each case.
    victim, heir, gw = stacks.get(relay, lambda: _splice_stack(certs, relay))
    victim.script(["Hel", "lo", " wor"], die=True)
    heir.script([*heir_first, *HEIR_REST], gap_s=0.01)
    # The victim's death counts against it: wait until the gateway routes to it again.
    _wait(lambda: _health(gw, "victim") == "up")
    with gw.client() as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "model": "coder",
                "stream": True,
                "max_tokens": 500,
                "stop": ["zzz", stop],
                "stream_options": {"include_usage": True},
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    assert heir.bodies[0]["messages"][-1] == {"role": "assistant", "content": "Hello wor"}
    frames = _frames(r.content)
    assert frames[-1] == b"data: [DONE]" and b'"error"' not in r.content
    chunks = [orjson.loads(f[6:]) for f in frames[:-1]]
    assert len({ch["id"] for ch in chunks}) == 1
    got = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks[:-1])
    finishes = [ch["choices"][0]["finish_reason"] for ch in chunks if ch["choices"]]
    finishes = [f for f in finishes if f]
    if text is None:  # no stop: the heir's own end, every piece relayed
        assert got == "Hello wor" + "".join(heir_first + HEIR_REST)
        assert finishes == ["length"] and heir.finished.wait(5)
        return
    assert got == text and finishes == ["stop"]
    # Every token generated is counted, the one the stop completed in included.
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3 + len(heir_first)
    assert heir.aborted.wait(5)  # the gateway closed the heir: its generation stops
    assert heir.sent < len(heir_first) + len(HEIR_REST)
