"""One table of stream cases, every API by every way a stream ends, run against the stream core
(proxy/relay/stream_core.py) directly and through the real gateway on each of its drivers (push,
pull) in front of a raw engine on loopback that writes vLLM's own bytes (the golden fixtures).

What is asserted of each case: the outcome and the client's last bytes (the engine's own end,
or the error event in the API's own shape with the status the case calls for)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from proxy.certs import CertFiles
from proxy.record.measure import Measurement
from proxy.relay.ends import CHAT_ENDS, MESSAGES_ENDS, RESPONSES_ENDS
from proxy.relay.events import reader_for
from proxy.relay.measure import StreamFilter
from proxy.relay.stream_core import (
    OUTPUT_BYTES_HEAD,
    OUTPUT_BYTES_PER_TOKEN,
    SilenceLimit,
    StreamCore,
    output_bound,
)
from tests.golden import GOLDEN

V = GOLDEN / "0.33.0"
MAX_FRAME = 64 * 1024  # the gateways' frame limit below (SPECROUTER_MAX_SSE_FRAME_BYTES)
MAX_TOKENS = 16  # every request's output-token limit below
BOUND = OUTPUT_BYTES_HEAD + MAX_TOKENS * OUTPUT_BYTES_PER_TOKEN


def _frames(name: str) -> list[bytes]:
    return [f + b"\n\n" for f in (V / name).read_bytes().split(b"\n\n") if f]


_RESPONSES_ERROR = b'event: error\ndata: {"type":"error","code":"500","message":"boom"}\n\n'

# By API: its path, its golden stream, the same stream ending in the engine's error event.
APIS: dict[str, tuple[str, list[bytes], list[bytes], tuple[bytes, ...]]] = {
    "chat": (
        "/v1/chat/completions",
        _frames("chat_stream_plain.sse"),
        _frames("chat_stream_error_midstream.sse"),
        CHAT_ENDS,
    ),
    "completions": (
        "/v1/completions",
        _frames("cmpl_stream_plain.sse"),
        _frames("cmpl_stream_error_midstream.sse"),
        CHAT_ENDS,
    ),
    "responses": (
        "/v1/responses",
        _frames("responses_stream.sse"),
        [*_frames("responses_stream.sse")[:6], _RESPONSES_ERROR],
        RESPONSES_ENDS,
    ),
    "messages": (
        "/v1/messages",
        _frames("anth_stream_plain.sse"),
        _frames("anth_stream_error_midstream.sse"),
        MESSAGES_ENDS,
    ),
}


@dataclass(frozen=True)
class Case:
    """What the engine sends, how it stops, and what the client must see last."""

    frames: list[bytes]
    stop: str  # "end": the chunked body's end | "lost": the connection cut | "hang": silence
    outcome: str
    status: int | None  # the gateway's error event's status; None: the engine's bytes last
    says: str = ""  # what its message must say


def _case(api: str, end: str) -> Case:
    _, plain, failing, _ = APIS[api]
    head = plain[:3]
    oversized = b"data: " + b"x" * (2 * MAX_FRAME)  # never ends within the limit
    # Whole events within the frame limit (comments: cheap to relay), past the output bound.
    flood = [b": " + b"x" * 32766 + b"\n\n"] * (BOUND // 32768 + 1)
    return {
        "end": Case(plain, "end", "ok", None),
        "engine_error": Case(failing, "end", "upstream_error", None),
        "eof_before_end": Case(head, "end", "upstream_error", 502),
        "connection_lost": Case(head, "lost", "upstream_error", 502),
        "oversized_frame": Case([*head, oversized], "hang", "upstream_error", 502),
        "silence": Case(head, "hang", "timeout", 504),
        "past_output_bound": Case([*head, *flood], "hang", "upstream_error", 502, "output passed"),
    }[end]


ENDS = (
    "end",
    "engine_error",
    "eof_before_end",
    "connection_lost",
    "oversized_frame",
    "silence",
    "past_output_bound",
)
CASES = [(api, end) for api in APIS for end in ENDS]


def _assert_last(api: str, case: Case, body: bytes, engine: bytes) -> None:
    """The client's last bytes: the engine's own, or the API's error event with its status."""
    if case.status is None:
        assert body.endswith(engine.rsplit(b"\n\n", 2)[-2] + b"\n\n"), body[-300:]
        return
    if api in ("chat", "completions"):
        assert body.endswith(b"data: [DONE]\n\n"), body[-300:]
        last = body[: -len(b"data: [DONE]\n\n")].rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
        error = json.loads(last.removeprefix(b"data: "))["error"]
        assert error["code"] == case.status and case.says in error["message"], error
        return
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith(b"event: error\ndata: "), last[:300]
    obj = json.loads(last.split(b"data: ", 1)[1])
    if api == "messages":  # Anthropic's error object
        assert obj["type"] == "error" and obj["error"]["message"], obj
        # Anthropic's names: a failure is an api_error (vLLM's too), a timeout a timeout_error.
        assert obj["error"]["type"] == {502: "api_error", 504: "timeout_error"}[case.status], obj
        assert case.says in obj["error"]["message"], obj
    else:
        assert obj["code"] == str(case.status) and case.says in obj["message"], obj


# -- the core, fed directly ---------------------------------------------------------------------


def _run_core(api: str, case: Case) -> tuple[str, bytes]:
    _, _, _, ends = APIS[api]
    m = Measurement(0.0)
    filt = StreamFilter(m, events=reader_for(api, m))
    core = StreamCore(filt, ends, MAX_FRAME, SilenceLimit(1.0, 1.0, 0.0, 0.0), bound=BOUND)
    out = b"".join(core.feed(f, 1.0) for f in case.frames)
    assert len(out) <= BOUND
    if case.stop == "end":
        out += core.eof(1.0)
    elif case.stop == "lost":
        core.lost(502, "upstream connection lost")
    elif not core.failed:
        assert core.deadline(0.0) == 1.0
        core.silence()
    outcome, error = core.result()
    return outcome, out + error


@pytest.mark.parametrize(("api", "end"), CASES)
def test_the_core_ends_each_stream_as_the_table_says(api: str, end: str) -> None:
    case = _case(api, end)
    outcome, body = _run_core(api, case)
    assert outcome == case.outcome
    _assert_last(api, case, body, b"".join(case.frames))
    if case.status is None:  # the engine's bytes, exactly
        assert body == b"".join(case.frames)


@pytest.mark.parametrize(
    ("end", "wanted"),
    [
        ("end", False),
        ("engine_error", False),  # the client has read the engine's error event and [DONE]
        ("eof_before_end", True),
        ("connection_lost", True),
        ("oversized_frame", True),
        ("silence", True),
        ("past_output_bound", False),  # its engine already sent more than was asked
    ],
)
def test_the_core_wants_a_continuation_only_for_a_broken_stream(end: str, wanted: bool) -> None:
    case = _case("chat", end)
    m = Measurement(0.0)
    limit = SilenceLimit(1.0, 1.0, 0.0, 0.0)
    core = StreamCore(StreamFilter(m), CHAT_ENDS, MAX_FRAME, limit, bound=BOUND)
    for f in case.frames:
        core.feed(f, 1.0)
    if case.stop == "end":
        core.eof(1.0)
    elif case.stop == "lost":
        core.lost(502, "upstream connection lost")
    elif not core.failed:
        core.silence()
    assert core.wants_continuation(True, closing=False) is wanted
    assert not core.wants_continuation(True, closing=True)
    assert not core.wants_continuation(False, closing=False)


_CLAMP = (("max_tokens", 1.0, 4096.0),)


@pytest.mark.parametrize(
    ("body", "inject", "clamps", "tokens"),
    [
        ({"max_tokens": 16}, {}, _CLAMP, 16),  # the client's limit
        ({"max_tokens": 9000}, {"max_tokens": 4096}, _CLAMP, 4096),  # clamped by the gateway
        ({}, {"max_output_tokens": 64}, (), 64),  # a default set, as Responses spells it
        ({"max_tokens": 8, "max_completion_tokens": 32}, {}, (), 32),  # chat's two: the larger
        ({}, {}, _CLAMP, 4096),  # none sent: the route's clamp (the engine's context)
        ({"max_tokens": None}, {}, (("top_p", 0.0, 1.0),), None),  # nothing known: unbounded
    ],
)
def test_the_output_bound_follows_the_output_tokens_sent(
    body: dict[str, Any],
    inject: dict[str, Any],
    clamps: tuple[tuple[str, float | None, float | None], ...],
    tokens: int | None,
) -> None:
    want = None if tokens is None else OUTPUT_BYTES_HEAD + tokens * OUTPUT_BYTES_PER_TOKEN
    assert output_bound(body, inject, clamps) == want


def test_the_core_pings_only_until_the_first_output() -> None:
    m = Measurement(0.0)
    filt = StreamFilter(m, events=reader_for("responses", m))
    core = StreamCore(filt, RESPONSES_ENDS, None, SilenceLimit(1.0, 1.0, 0.0, 0.0), b"P")
    frames = APIS["responses"][1]
    core.feed(frames[0] + frames[1], 1.0)  # response.created, response.in_progress
    assert not core.has_output and core.ping() == b"P"
    for f in frames[2:]:
        core.feed(f, 2.0)
    assert core.has_output and core.ping() == b""


# -- the drivers, through the real gateway ------------------------------------------------------


class RawEngine:
    """An HTTP/1.1 engine on loopback, in its own thread, that answers each POST with the case
    its body names (`case`: "api/end")."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def __enter__(self) -> RawEngine:
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, "127.0.0.1", 0), self.loop
        ).result(5)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ok = b"HTTP/1.1 200 OK\r\nconnection: close\r\n"
        try:
            head = await r.readuntil(b"\r\n\r\n")
            fields = head.decode("latin-1").split("\r\n")
            length = next(
                (int(f.split(":")[1]) for f in fields if f.lower().startswith("content-length")), 0
            )
            body = await r.readexactly(length)
            if head.startswith(b"GET "):
                w.write(ok + b"content-type: text/plain\r\ncontent-length: 0\r\n\r\n")
                return
            api, end = json.loads(body)["case"].split("/")
            case = _case(api, end)
            w.write(ok + b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            for frame in case.frames:
                w.write(b"%x\r\n%b\r\n" % (len(frame), frame))
                await w.drain()
            if case.stop == "end":
                w.write(b"0\r\n\r\n")
            elif case.stop == "hang":
                await asyncio.sleep(30)
            await w.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            w.close()


def _post(gw: GatewayServer, api: str, end: str) -> tuple[int, bytes]:
    path = APIS[api][0]
    body: dict[str, Any] = {"model": "coder", "stream": True, "case": f"{api}/{end}"}
    body["max_output_tokens" if api == "responses" else "max_tokens"] = MAX_TOKENS
    if api in ("chat", "messages"):
        body["messages"] = [{"role": "user", "content": "hi"}]
    body["prompt" if api == "completions" else "input"] = "hi"
    if api in ("chat", "messages"):
        del body["input"]
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    with (
        httpx.Client(base_url=gw.base, verify=ctx, timeout=20.0, headers=headers) as c,
        c.stream("POST", path, json=body) as r,
    ):
        return r.status_code, b"".join(r.iter_raw())


@pytest.fixture(scope="module", params=["push", "pull"])
def driven(request: pytest.FixtureRequest, certs: CertFiles) -> Iterator[dict[str, Any]]:
    """Every case through one driver, all at once (the silent ones wait out one idle timeout
    together): the client's status and body by case."""
    with RawEngine() as engine, pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECROUTER_MAX_SSE_FRAME_BYTES", str(MAX_FRAME))
        policy = coder_policy({"raw": engine.url}, defaults={})
        # Most cases fail on purpose: the engine is not marked down for them.
        policy["health"] = {"fail_after": len(CASES)}
        args = ("--relay", request.param, "--first-byte-timeout", "1", "--idle-timeout", "1")
        with GatewayServer(policy, certs=certs, args=args) as gw:
            deadline = time.monotonic() + 10
            with gw.client() as c:
                while c.get("/readyz").status_code != 200:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            with ThreadPoolExecutor(len(CASES)) as pool:
                got = dict(zip(CASES, pool.map(lambda c: _post(gw, *c), CASES), strict=True))
            yield got


@pytest.mark.parametrize(("api", "end"), CASES)
def test_each_driver_ends_each_stream_as_the_core_does(
    driven: dict[tuple[str, str], tuple[int, bytes]], api: str, end: str
) -> None:
    status, body = driven[(api, end)]
    assert status == 200, body[:300]
    case = _case(api, end)
    engine = b"".join(case.frames).replace(b'"qwen3.8-27b"', b'"coder"')
    _assert_last(api, case, body, engine)
