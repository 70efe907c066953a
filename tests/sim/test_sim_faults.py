"""Aborts on client disconnect, and every fault mode, against a real sim."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.sim import SimServer, sse_data

MODEL = "coder"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer("dflash7-prob-block", served_model_name=MODEL) as s:
        yield s


@pytest.fixture(autouse=True)
def _clean(sim: SimServer) -> Iterator[None]:
    sim.clear_faults()
    yield
    sim.clear_faults()


def wait_for(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def body(**kw: Any) -> dict[str, Any]:
    b: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "go"}],
        "max_tokens": 30,
    }
    b.update(kw)
    return b


def test_stream_disconnect_aborts_and_frees_the_slot(sim: SimServer) -> None:
    before = sim.stats()["aborted"]
    with httpx.Client(timeout=10) as client:
        with client.stream(
            "POST",
            sim.url + "/v1/chat/completions",
            json=body(stream=True, max_tokens=100_000, ignore_eos=True),
        ) as resp:
            lines = resp.iter_lines()
            for _ in range(6):
                next(lines)
            assert sim.stats()["running"] == 1
    wait_for(lambda: sim.stats()["aborted"] == before + 1)
    wait_for(lambda: sim.stats()["running"] == 0)


def test_non_streaming_disconnect_aborts(sim: SimServer) -> None:
    before = sim.stats()["aborted"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            sim.url + "/v1/chat/completions",
            json=body(max_tokens=100_000, ignore_eos=True),
            timeout=0.3,
        )
    wait_for(lambda: sim.stats()["aborted"] == before + 1)
    wait_for(lambda: sim.stats()["running"] == 0)


def test_die_mid_stream_drops_the_connection(sim: SimServer) -> None:
    sim.fault("die_mid_stream", after_chunks=3)
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 503
    received: list[bytes] = []
    with httpx.Client(timeout=10) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            with client.stream(
                "POST", sim.url + "/v1/chat/completions", json=body(stream=True, max_tokens=500)
            ) as resp:
                assert resp.status_code == 200
                for chunk in resp.iter_raw():
                    received.append(chunk)
    frames = sse_data(b"".join(received))
    assert len(frames) == 3 and b"[DONE]" not in frames  # no proper end
    # A non-streaming request loses its connection before any response.
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=10)
    stats = sim.stats()
    assert stats["dropped"] >= 1 and stats["active_faults"][0]["mode"] == "die_mid_stream"
    wait_for(lambda: sim.stats()["running"] == 0)
    sim.clear_faults()
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 200
    ok = httpx.post(sim.url + "/v1/chat/completions", json=body(stream=True), timeout=10)
    assert sse_data(ok.content)[-1] == b"[DONE]"


def test_hang_stops_sending_without_closing(sim: SimServer) -> None:
    with httpx.Client(timeout=httpx.Timeout(10, read=0.5)) as client:
        with client.stream(
            "POST", sim.url + "/v1/chat/completions", json=body(stream=True, max_tokens=400)
        ) as resp:
            lines = resp.iter_lines()
            next(lines)
            sim.fault("hang")
            time.sleep(0.1)  # let a step in flight land
            with pytest.raises(httpx.ReadTimeout):
                for _ in lines:
                    pass
    # New requests hang too; the engine resumes when cleared.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=0.3)
    sim.clear_faults()
    resp = httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=10)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 30


@pytest.mark.parametrize(
    ("mode", "status", "err_type"),
    [("http_500", 500, "InternalServerError"), ("http_503", 503, "Service Unavailable")],
)
def test_http_errors(sim: SimServer, mode: str, status: int, err_type: str) -> None:
    sim.fault(mode, count=2)
    for _ in range(2):
        resp = httpx.post(sim.url + "/v1/chat/completions", json=body(stream=True), timeout=10)
        assert resp.status_code == status
        err = resp.json()["error"]
        assert (
            err["type"] == err_type
            and err["code"] == status
            and list(err) == ["message", "type", "param", "code"]
        )
    assert sim.stats()["active_faults"] == []  # used up
    assert httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=10).status_code == 200


def test_health_fail_keeps_serving(sim: SimServer) -> None:
    sim.fault("health_fail")
    resp = httpx.get(sim.url + "/health", timeout=5)
    assert resp.status_code == 503 and resp.content == b""
    assert httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=10).status_code == 200


def test_cold_start_then_ready(sim: SimServer) -> None:
    # 30 s x time scale 0.05 = 1.5 s: long enough for the checks below on a loaded machine.
    sim.fault("cold_start", seconds=30)
    assert httpx.get(sim.url + "/health", timeout=5).status_code == 503
    assert httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=5).status_code == 503
    assert httpx.get(sim.url + "/v1/models", timeout=5).status_code == 503
    wait_for(lambda: httpx.get(sim.url + "/health", timeout=5).status_code == 200)
    assert httpx.post(sim.url + "/v1/chat/completions", json=body(), timeout=5).status_code == 200


def test_acceptance_collapse(sim: SimServer) -> None:
    sim.fault("acceptance_collapse", factor=0.0)
    resp = httpx.post(
        sim.url + "/v1/chat/completions",
        json=body(stream=True, return_token_ids=True, max_tokens=20),
        timeout=10,
    )
    import json

    chunks = [json.loads(f) for f in sse_data(resp.content)[1:-1]]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in chunks)
    assert len(chunks) == 20
    sim.clear_faults()
    resp = httpx.post(
        sim.url + "/v1/chat/completions",
        json=body(stream=True, return_token_ids=True, max_tokens=60),
        timeout=10,
    )
    chunks = [json.loads(f) for f in sse_data(resp.content)[1:-1]]
    assert len(chunks) < 60


def test_bad_fault_request(sim: SimServer) -> None:
    resp = httpx.post(sim.url + "/_sim/faults", json={"mode": "meteor"}, timeout=5)
    assert resp.status_code == 400
    resp = httpx.post(
        sim.url + "/_sim/faults", json={"mode": "acceptance_collapse", "factor": 3}, timeout=5
    )
    assert resp.status_code == 400


def test_kill_and_restart_on_the_same_port() -> None:
    with SimServer("mtp3", served_model_name=MODEL) as s:
        port = s.port
        s.kill()
        with pytest.raises(httpx.ConnectError):
            httpx.get(s.url + "/health", timeout=2)
        s.restart()
        assert s.port == port
        assert httpx.get(s.url + "/health", timeout=5).status_code == 200
        assert s.stats()["requests"] == 0


def test_no_control_endpoints_without_faults() -> None:
    with SimServer("nospec", faults=False) as s:
        assert httpx.get(s.url + "/_sim/stats", timeout=5).status_code == 404
