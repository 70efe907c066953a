"""Keepalive during a silent prefill (a route's `keepalive_s`), and retries that cannot multiply
load: pings while no engine byte came, then the engine's bytes untouched; TTFT without the
pings; a failure before the first byte retried, an engine that timed out after its headers not;
vLLM's own `: keep-alive` comments relayed and not counted; a Responses prefill longer than the
idle timeout, after the engine's first events, waits for its first token. Both relays."""

from __future__ import annotations

import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.relay.stream_core import SilenceLimit

SERVED = "qwen3.8-27b"
MESSAGES = [{"role": "user", "content": "Implement quicksort in `sort.py`."}]
SCALE = 0.05  # the sims' time scale: a fault's `seconds` are simulated seconds
EVERY = 0.25  # keepalive_s
SILENCE = 0.8  # a silent prefill, real seconds
FIRST_BYTE_TIMEOUT = 3.0
# Shorter than LONG_PREFILL's prefill, by more than the pull relay's 1 s of slack.
IDLE_TIMEOUT = 0.5
# 80K tokens (two a word): 2 s of prefill at the sims' 2,000 tokens/s and SCALE.
LONG_PREFILL = " ".join(f"w{i % 997}" for i in range(40_000))
PING = b": ping\n\n"
_CREATED = re.compile(rb'"created":\d+')


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, SimServer]]:
    """a serves, b is the fallback, c fails, k sends vLLM 0.29's keep-alive comments."""
    servers = {
        name: SimServer("mtp3", served_model_name=SERVED, time_scale=SCALE, extra_args=extra)
        for name, extra in (
            ("a", ()),
            ("b", ()),
            ("c", ()),
            ("k", ("--sse-keep-alive-interval", "0.1")),
        )
    }
    try:
        for sim in servers.values():
            sim.start()
        yield servers
    finally:
        for sim in servers.values():
            sim.stop()


def _policy(sims: dict[str, SimServer]) -> dict[str, Any]:
    doc = coder_policy({name: sim.url for name, sim in sims.items()}, defaults={})
    route = {"task": "generate", "keepalive_s": EVERY}
    doc["routes"] = {
        "coder": {**route, "models": ["coder", SERVED], "variants": ["a"]},
        "flaky": {**route, "models": ["flaky"], "variants": ["c", "b"], "fallback": "b"},
        "doomed": {**route, "models": ["doomed"], "variants": ["c"]},
        "vka": {**route, "models": ["vka"], "variants": ["k"]},
    }
    return doc


@pytest.fixture(scope="module", params=["push", "pull"])
def gw(
    request: pytest.FixtureRequest, sims: dict[str, SimServer], certs: Any
) -> Iterator[GatewayServer]:
    with GatewayServer(
        _policy(sims),
        certs=certs,
        args=(
            "--relay",
            request.param,
            "--first-byte-timeout",
            str(FIRST_BYTE_TIMEOUT),
            "--idle-timeout",
            str(IDLE_TIMEOUT),
        ),
    ) as server:
        yield server


class Reader(threading.Thread):
    """One streaming request, read chunk by chunk with arrival times; `pinged` once a ping
    came."""

    def __init__(self, gw: GatewayServer, model: str, rid: str, **extra: Any) -> None:
        super().__init__(daemon=True)
        self.gw, self.rid = gw, rid
        self.body = {
            "model": model,
            "messages": MESSAGES,
            "stream": True,
            "max_tokens": 24,
            "seed": 3,
            "temperature": 0.7,
            **extra,
        }
        self.chunks: list[tuple[float, bytes]] = []
        self.headers: httpx.Headers | None = None
        self.status = 0
        self.pinged = threading.Event()
        self.t0 = 0.0

    def run(self) -> None:
        with self.gw.client() as c:
            self.t0 = time.monotonic()
            with c.stream(
                "POST", "/v1/chat/completions", json=self.body, headers={"x-request-id": self.rid}
            ) as r:
                self.status, self.headers = r.status_code, r.headers
                for chunk in r.iter_raw():
                    self.chunks.append((time.monotonic() - self.t0, chunk))
                    if PING in chunk:
                        self.pinged.set()

    @property
    def raw(self) -> bytes:
        return b"".join(c for _, c in self.chunks)

    def finish(self) -> Reader:
        self.join(30)
        assert not self.is_alive()
        return self


def _stream(gw: GatewayServer, model: str, rid: str, **extra: Any) -> Reader:
    reader = Reader(gw, model, rid, **extra)
    reader.start()
    return reader


def _log_row(gw: GatewayServer, rid: str) -> sqlite3.Row:
    """The request's row in the request log (written in batches)."""
    end = time.monotonic() + 5
    while True:
        conn = sqlite3.connect(gw.dir / "state" / "requests.sqlite3")
        conn.row_factory = sqlite3.Row
        try:
            row = conn.execute("SELECT * FROM requests WHERE request_id = ?", (rid,)).fetchone()
        except sqlite3.OperationalError:
            row = None  # the table is created with the first batch
        finally:
            conn.close()
        if row is not None:
            return row
        assert time.monotonic() < end, f"no request-log row for {rid}"
        time.sleep(0.1)


def _crash_during_prefill(c: SimServer, reader: Reader) -> None:
    """c dies once the client has had a ping: its connection goes before any body byte."""
    assert reader.pinged.wait(5), "no ping during the silent prefill"
    c.fault("die_mid_stream", after_chunks=0)
    c.fault("hang", seconds=0)  # the engine steps again: its first frame drops the connection


def _up_again(gw: GatewayServer, sim: SimServer, name: str) -> None:
    sim.clear_faults()
    end = time.monotonic() + 10
    while gw.admin_get("/admin/status").json()["backends"][name]["health"] != "up":
        assert time.monotonic() < end, f"{name} not up again"
        time.sleep(0.1)


def test_pings_during_a_silent_prefill_then_the_engines_bytes(gw, sims) -> None:
    a = sims["a"]
    direct_body = {
        "model": SERVED,
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 24,
        "seed": 3,
        "temperature": 0.7,
    }
    want = httpx.post(
        a.url + "/v1/chat/completions",
        json=direct_body,
        headers={"x-request-id": "ka-1"},
        timeout=30,
    ).content
    a.fault("hang", seconds=SILENCE / SCALE)
    reader = _stream(gw, SERVED, "ka-1").finish()
    assert reader.status == 200 and reader.headers is not None
    assert reader.headers["content-type"].startswith("text/event-stream")
    assert reader.headers["x-specrouter-variant"] == "a"
    raw = reader.raw
    n = 0
    while raw.startswith(PING, n * len(PING)):
        n += 1
    assert 2 <= n <= 5, raw[:200]
    pings = n * len(PING)
    # The engine's bytes follow, untouched, and no ping after them.
    assert _CREATED.sub(b"", raw[pings:]) == _CREATED.sub(b"", want)
    assert PING not in raw[pings:]
    times = [t for t, chunk in reader.chunks if PING in chunk]
    assert times[0] >= EVERY * 0.8, times
    assert all(0.1 < t2 - t1 < 0.6 for t1, t2 in zip(times, times[1:], strict=False)), times
    # TTFT is the engine's first frame, not the first ping.
    row = _log_row(gw, "ka-1")
    assert row["outcome"] == "ok" and row["completion_tokens"] > 0
    assert row["ttft_s"] >= SILENCE * 0.9 > times[0], (row["ttft_s"], times)


def test_the_openai_sdk_reads_a_pinged_stream(gw, sims) -> None:
    sims["a"].fault("hang", seconds=SILENCE / SCALE)
    text, finish = "", None
    with gw.openai() as client:  # closed: an open TLS socket would warn in a later test
        for chunk in client.chat.completions.create(
            model=SERVED, messages=MESSAGES, stream=True, max_tokens=16
        ):
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
    assert text and finish in ("stop", "length")


def test_a_failure_after_pings_is_retried_on_the_next_engine(gw, sims) -> None:
    b, c = sims["b"], sims["c"]
    before = b.stats()["requests"]
    c.fault("hang")
    reader = _stream(gw, "flaky", "ka-retry")
    try:
        _crash_during_prefill(c, reader)
        reader.finish()
    finally:
        _up_again(gw, c, "c")
    raw = reader.raw
    assert reader.status == 200 and raw.startswith(PING)
    assert raw.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"' in raw
    assert b'data: {"error"' not in raw
    assert b.stats()["requests"] == before + 1
    assert 'specrouter_retries_total{backend="b",route="flaky"}' in gw.metrics()


def test_an_engine_that_timed_out_after_its_headers_is_not_sent_again(gw, sims) -> None:
    b, c = sims["b"], sims["c"]
    before = b.stats()["requests"]
    c.fault("hang")
    try:
        reader = _stream(gw, "flaky", "ka-timeout").finish()
    finally:
        _up_again(gw, c, "c")
    raw = reader.raw
    frames = raw.split(b"\n\n")
    assert reader.status == 200 and raw.startswith(PING)
    assert frames[-3].startswith(b'data: {"error": {') and b"504" in frames[-3], raw[-300:]
    assert frames[-2] == b"data: [DONE]" and frames[-1] == b""
    assert b.stats()["requests"] == before  # never sent to the fallback
    assert _log_row(gw, "ka-timeout")["outcome"] == "upstream_error"


def test_none_can_serve_ends_with_the_error_event_and_done(gw, sims) -> None:
    c = sims["c"]
    c.fault("hang")
    reader = _stream(gw, "doomed", "ka-none")
    try:
        _crash_during_prefill(c, reader)
        reader.finish()
    finally:
        _up_again(gw, c, "c")
    frames = reader.raw.split(b"\n\n")
    assert reader.status == 200 and frames[0] == b": ping"
    assert frames[-3].startswith(b'data: {"error": {') and b"502" in frames[-3]
    assert frames[-2] == b"data: [DONE]" and frames[-1] == b""


def test_vllm_keep_alive_comments_are_relayed_and_not_counted(gw, sims) -> None:
    sims["k"].fault("hang", seconds=SILENCE / SCALE)
    reader = _stream(gw, "vka", "ka-vllm").finish()
    raw = reader.raw
    assert reader.status == 200 and raw.startswith(b": keep-alive\n\n")
    # The engine's comments (every 0.1 s) reset the gateway's silence (0.25 s), so no ping is
    # due; a loaded machine's scheduling gap may let one through, against three without them.
    assert raw.count(b": keep-alive\n\n") >= 2 and raw.count(PING) <= 1
    assert raw.endswith(b"data: [DONE]\n\n")
    row = _log_row(gw, "ka-vllm")
    # Counted, the first comment (at once, then every 0.1 s) would be the first token; the
    # silence starts when the fault is set, a loaded machine's moment before the request comes.
    assert row["outcome"] == "ok" and row["ttft_s"] >= SILENCE / 2


@pytest.mark.parametrize(
    ("last", "has_output", "due"),
    [
        (0.0, False, 300.0),  # asked at 0: the first-byte timeout, not the idle one
        (250.0, False, 310.0),  # an event late in the prefill: the idle timeout past it
        (1.0, True, 61.0),  # once the engine has output: the idle timeout alone
        (290.0, True, 350.0),
    ],
)
def test_the_silence_limit_is_the_first_byte_timeout_until_the_first_output(
    last: float, has_output: bool, due: float
) -> None:
    limit = SilenceLimit(idle=60.0, first_byte=300.0, now=10.0, asked_ago=10.0)
    assert limit.due(last, has_output) == due
    said = limit.message(has_output)
    assert ("nothing for 60s" if has_output else "no output in 300s") in said


def test_a_responses_prefill_longer_than_the_idle_timeout_reaches_its_first_token(gw) -> None:
    """After the engine's first events the pings go on as data events, until the first output;
    the OpenAI SDK's stream helper (which refuses any event before `response.created`) reads
    them as events of a type it does not know, the engine's sequence numbers untouched."""
    # A prompt of its own: another's prefix in the sim's cache would shorten the prefill.
    prompt = f"{uuid.uuid4()} {LONG_PREFILL}"
    events: list[tuple[float, str, int | None]] = []
    with gw.openai() as client:
        t0 = time.monotonic()
        with client.responses.stream(model=SERVED, input=prompt, max_output_tokens=8) as stream:
            for event in stream:
                seq = getattr(event, "sequence_number", None)
                events.append((time.monotonic() - t0, event.type, seq))
    kinds = [k for _, k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert "error" not in kinds and kinds[-1] in ("response.completed", "response.incomplete")
    first = next(i for i, (_, k, _) in enumerate(events) if k == "response.output_text.delta")
    # The prefill outlasted the idle timeout after the engine's first events, pinged meanwhile.
    assert events[first][0] - events[1][0] > IDLE_TIMEOUT, events[:4]
    assert "keepalive" in kinds[2:first] and "keepalive" not in kinds[first:], kinds
    assert [q for _, k, q in events if k != "keepalive"] == list(
        range(len(kinds) - kinds.count("keepalive"))
    )
