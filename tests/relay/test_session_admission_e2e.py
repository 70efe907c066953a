"""Session-aware admission end to end: the real gateway in front of a simulated engine whose
KV (as the policy states it) holds one session's prefix at a time, with the real openai and
anthropic SDKs. Held streams get pings (SSE comments; Anthropic's ping events), then their
answer, or past `stream_wait_s` the API's error event; a held non-streaming request times out
with 503 and Retry-After; waiting sessions go first come first served, shared per client, a
client's retry keeping its place, across a policy reload; a compaction of the resident session is never held and ends
its residency, one of another session, or a request of none, is held as a turn;
a waiting session moves where that pays; the admin explain says why a turn would wait.

The engine: 3,000 KV tokens x 0.9 less 4 x 100 kept for turns = 2,300 tokens of prefixes; each
session's prompt is ~1,500 tokens (6,000 bytes): one resident at a time. Residencies end only
by compaction here (idle_s is long), so each step is released by the test, not by a clock.
Each test has its own backend (the same simulator): residency is per backend."""

from __future__ import annotations

import re
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from loadtests.harness.gateway import (
    ADMIN_TOKEN,
    CLIENT_KEY,
    OTHER_KEY,
    GatewayServer,
    coder_policy,
)
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
PING = b": ping\n\n"
MESSAGES_PING = b"event: ping\n"
PROMPT = "Refactor the parser in `parse.py`. " + "Context line of the repository. " * 190


def _policy(url: str, **sessions: Any) -> dict[str, Any]:
    doc = coder_policy({"sim": url}, defaults={})
    doc["backends"]["sim"].update(kv_tokens=3000, max_concurrency=4)
    doc["backends"]["sim2"] = dict(doc["backends"]["sim"])
    # Another engine's worth for the same sim: a waiting session moves there when that pays.
    doc["backends"]["spare"] = {**doc["backends"]["sim"], "kv_tokens": 100_000}
    route = {"task": "generate", "keepalive_s": 0.3}
    doc["routes"] = {
        "coder": {**route, "models": ["coder", SERVED], "variants": ["sim"]},
        "coder2": {**route, "models": ["coder2"], "variants": ["sim2"]},
        "mover": {**route, "models": ["mover"], "variants": ["sim2", "spare"]},
    }
    doc["admission"] = {
        "queue_timeout_s": 1.0,
        "sessions": {
            "enabled": True,
            "max_wait_s": None,
            "idle_s": 600,
            "turn_tokens": 100,
            "shared_prefix_tokens": 0,
            "stream_wait_s": 30,
            **sessions,
        },
    }
    return doc


@pytest.fixture(scope="module")
def gw(certs: Any) -> Iterator[GatewayServer]:
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as sim,
        GatewayServer(_policy(sim.url), certs=certs) as server,
    ):
        server.sim_url = sim.url  # type: ignore[attr-defined]
        yield server


def _chat(session: str, stream: bool, prompt: str = PROMPT, model: str = "coder") -> dict[str, Any]:
    return {
        "model": model,
        "stream": stream,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": f"[{session}] {prompt}"}],
    }


class Stream(threading.Thread):
    """One raw streaming request: its bytes, when its first event (not a ping) came."""

    def __init__(
        self, gw: GatewayServer, session: str, *, path: str = "/v1/chat/completions",
        body: dict[str, Any] | None = None, leave_after_ping: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.gw, self.session, self.path = gw, session, path
        self.body = body or _chat(session, True)
        self.leave = leave_after_ping
        self.raw = b""
        self.first_event: float | None = None
        self.pinged = threading.Event()
        self.status = 0

    def run(self) -> None:
        with (
            self.gw.client() as c,
            c.stream(
                "POST", self.path, json=self.body,
                headers={"x-claude-code-session-id": self.session},
            ) as r,
        ):  # fmt: skip
            self.status = r.status_code
            for chunk in r.iter_raw():
                self.raw += chunk
                if PING in chunk or MESSAGES_PING in chunk:
                    self.pinged.set()
                    if self.leave:
                        return
                if self.first_event is None and re.search(rb"(^|\n)(data|event): (?!ping)", chunk):
                    self.first_event = time.monotonic()

    def done(self) -> Stream:
        self.join(30)
        assert not self.is_alive()
        return self


def _metric(gw: GatewayServer, pattern: str) -> float:
    found = re.findall(rf"^{pattern} ([0-9.e+]+)$", gw.metrics(), re.M)
    return sum(float(v) for v in found)


def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def _waiting(gw: GatewayServer, backend: str = "sim") -> float:
    return _metric(gw, rf'specrouter_session_waiting\{{backend="{backend}"\}}')


def _resident_turn(
    gw: GatewayServer, session: str, prompt: str = PROMPT, model: str = "coder"
) -> None:
    """A turn of `session` through the openai SDK: then it is the resident one."""
    with gw.openai(max_retries=0) as client:
        got = client.chat.completions.create(
            **_chat(session, False, prompt, model),
            extra_headers={"x-claude-code-session-id": session},
        )
    assert got.choices[0].message.content


def _messages(session: str, model: str) -> dict[str, Any]:
    content = f"[{session}] {PROMPT}"
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": content}]}


class _Post(threading.Thread):
    """One raw request, answered in the background: its status and text."""

    def __init__(
        self,
        gw: GatewayServer,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.gw, self.path, self.body, self.headers = gw, path, body, headers or {}
        self.status, self.text = 0, ""
        self.start()

    def run(self) -> None:
        with self.gw.client() as c:
            r = c.post(self.path, json=self.body, headers=self.headers, timeout=30)
            self.status, self.text = r.status_code, r.text

    def done(self) -> int:
        self.join(30)
        return self.status


def _compact(gw: GatewayServer, session: str, model: str = "coder", key: str = CLIENT_KEY) -> None:
    """A compaction of resident `session` (Messages, the anthropic SDK): never held, and it
    ends the session's residency."""
    with _anthropic(gw, key) as sdk:
        msg = sdk.messages.create(
            model=model, max_tokens=8,
            messages=[{"role": "user", "content": f"[{session}] {PROMPT}"}],
            extra_headers={
                "x-claude-code-session-id": session,
                "x-claude-code-request-class": "compaction",
            },
        )  # fmt: skip
        assert msg.content


class SdkStream(threading.Thread):
    """A streamed chat turn through the openai SDK: its text, when its first content came."""

    def __init__(
        self, gw: GatewayServer, session: str, model: str = "coder", key: str = CLIENT_KEY
    ) -> None:
        super().__init__(daemon=True)
        self.gw, self.session, self.model, self.key = gw, session, model, key
        self.text, self.first, self.error = "", 0.0, None

    def run(self) -> None:
        headers = {"x-claude-code-session-id": self.session}
        try:
            with (
                self.gw.openai(self.key, max_retries=0) as sdk,
                sdk.chat.completions.create(
                    **_chat(self.session, True, model=self.model), extra_headers=headers
                ) as events,
            ):
                for event in events:
                    for choice in event.choices:
                        self.text += choice.delta.content or ""
                        self.first = self.first or time.monotonic()
        except openai.APIError as exc:
            self.error = exc

    def done(self) -> SdkStream:
        self.join(30)
        assert not self.is_alive()
        return self


def _anthropic(gw: GatewayServer, key: str = CLIENT_KEY) -> anthropic.Anthropic:
    ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
    return anthropic.Anthropic(
        base_url=gw.base, api_key=key, max_retries=0,
        http_client=anthropic.DefaultHttpxClient(verify=ctx),
    )  # fmt: skip


def _apply(gw: GatewayServer, **sessions: Any) -> None:
    gw.write_policy(_policy(gw.sim_url, **sessions))  # type: ignore[attr-defined]
    gw.hup()

    def applied() -> bool:
        doc = gw.admin_get("/admin/policy").json()["document"]
        return all(doc["admission"]["sessions"][k] == v for k, v in sessions.items())

    _until(applied)


class AnthropicStream(threading.Thread):
    """A Messages stream through the anthropic SDK: its text, when it ended."""

    def __init__(self, gw: GatewayServer, session: str) -> None:
        super().__init__(daemon=True)
        self.gw, self.session = gw, session
        self.text, self.end = "", 0.0

    def run(self) -> None:
        with (
            _anthropic(self.gw) as sdk,
            sdk.messages.stream(
                model="coder", max_tokens=8,
                messages=[{"role": "user", "content": f"[{self.session}] {PROMPT}"}],
                extra_headers={"x-claude-code-session-id": self.session},
            ) as stream,
        ):  # fmt: skip
            self.text = "".join(stream.text_stream)
            self.end = time.monotonic()

    def done(self) -> AnthropicStream:
        self.join(30)
        assert not self.is_alive()
        return self


def test_held_streams_pinged_then_answered_in_order_across_retry_and_reload(
    gw: GatewayServer,
) -> None:
    _resident_turn(gw, "a")
    b = Stream(gw, "b")
    b.start()
    _until(lambda: _waiting(gw) >= 1)
    c = Stream(gw, "c", leave_after_ping=True)  # leaves after its first ping: place kept
    c.start()
    c.done()
    assert c.pinged.is_set() and c.status == 200
    gone = r'specrouter_session_waits_total\{backend="sim",outcome="client_gone"\}'
    _until(lambda: _metric(gw, gone) >= 1)
    d = SdkStream(gw, "d")  # the openai SDK, pinged while held (SSE comments)
    d.start()
    _until(lambda: _waiting(gw) >= 2)
    # The admin explain says why another session's turn would wait.
    explained = httpx.post(
        gw.admin + "/admin/policy/explain",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        json={"request": _chat("e", True), "headers": {"x-claude-code-session-id": "e"}},
        timeout=10,
    ).json()["admission"]
    assert explained["admit"] is False and explained["reason"] == "full", explained
    assert explained["source"] == "live" and "> 0.9 x 3,000 KV tokens" in explained["detail"]
    # A policy applied (another place_kept_s) while b and d wait: nothing lost.
    _apply(gw, place_kept_s=100.0)
    _compact(gw, "a")  # a's residency ends: b, the first waiting, goes
    b.done()
    assert b.status == 200 and b.pinged.is_set() and b.first_event is not None
    assert b.raw.index(PING) < b.raw.index(b"data: ")  # pings while held, then the answer
    assert b"[DONE]" in b.raw and b'"error"' not in b.raw
    # c's retry, a Messages stream through the anthropic SDK: its place is before d's.
    c2 = AnthropicStream(gw, "c")
    c2.start()
    _until(lambda: _waiting(gw) >= 2)
    # Another client's session, after c's and d's places: the queue is shared per client, so
    # it goes first (this client's b went last); first come first served, it went last.
    o = SdkStream(gw, "o", key=OTHER_KEY)
    o.start()
    _until(lambda: _waiting(gw) >= 3)
    assert d.is_alive() and c2.is_alive()
    _compact(gw, "b")
    o.done()
    assert o.error is None and o.text and c2.is_alive() and d.is_alive()
    _compact(gw, "o", key=OTHER_KEY)
    c2.done()
    assert c2.text and d.is_alive()  # d still waits: c is resident now
    _compact(gw, "c")
    d.done()
    assert d.error is None and d.text and o.first < c2.end < d.first
    admitted = r'specrouter_session_waits_total\{backend="sim",outcome="admitted"\}'
    assert _metric(gw, admitted) == 4
    full = r'specrouter_session_admission_total\{backend="sim",reason="full",verdict="wait"\}'
    assert _metric(gw, full) >= 4


def test_held_turns_time_out_and_only_a_resident_compaction_is_never_held(
    gw: GatewayServer, request: pytest.FixtureRequest
) -> None:
    _apply(gw, stream_wait_s=1.0)
    _resident_turn(gw, "r", model="coder2")
    client = gw.openai(max_retries=0)
    request.addfinalizer(client.close)
    # A compaction of another session (its class declared by the client) and a bare prompt
    # (no session) would take the KV as a turn does: they are held as one, alongside.
    compaction = {"x-claude-code-session-id": "k", "x-claude-code-request-class": "compaction"}
    k = _Post(gw, "/v1/messages", _messages("k", "coder2"), compaction)
    bare = _Post(gw, "/v1/completions", {"model": "coder2", "prompt": PROMPT, "max_tokens": 8})
    t1 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            **_chat("n", False, model="coder2"), extra_headers={"x-claude-code-session-id": "n"}
        )
    assert caught.value.status_code == 503 and 0.9 < time.monotonic() - t1
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert "session-aware admission" in caught.value.message
    assert k.done() == 503 and bare.done() == 503, (k.text, bare.text)
    assert "session-aware admission" in k.text and "session-aware admission" in bare.text
    # A session that would wait on sim2 moves to spare, free: the wait (600 s expected) is more
    # than re-prefilling its ~1,500 tokens there (0.75 s at 2,000 tokens/s).
    moved = client.chat.completions.with_raw_response.create(
        **_chat("v", False, model="mover"), extra_headers={"x-claude-code-session-id": "v"}
    )
    assert moved.headers["x-specrouter-variant"] == "spare"
    assert moved.headers["x-specrouter-reason"] == "session-move"
    # Held streams past stream_wait_s: Anthropic's ping events, then its error event; the
    # openai SDK reads the pings and raises the error event.
    m = Stream(gw, "m", path="/v1/messages", body={
        "model": "coder2", "max_tokens": 8, "stream": True,
        "messages": [{"role": "user", "content": f"[m] {PROMPT}"}],
    })  # fmt: skip
    m.start()
    m2 = SdkStream(gw, "m2", model="coder2")
    m2.start()
    m.done(), m2.done()
    assert m.status == 200 and m.raw.startswith(MESSAGES_PING)
    assert b"event: error\n" in m.raw and b'"type":"overloaded_error"' in m.raw.replace(b" ", b"")
    assert b"session-aware admission" in m.raw and b"message_start" not in m.raw
    assert isinstance(m2.error, openai.APIError) and not m2.text
    assert "session-aware admission" in str(m2.error)
    # A compaction of the resident session goes at once, the engine full: it reads the prefix
    # the engine holds.
    _compact(gw, "r", "coder2")
    cls = r'specrouter_session_admission_total\{backend="sim2",reason="class",verdict="admit"\}'
    assert _metric(gw, cls) == 1
    # The engine empty, a bare prompt goes; it was counted while it ran, not kept after.
    assert _Post(gw, "/v1/completions", {**bare.body, "max_tokens": 1}).done() == 200
    assert _metric(gw, r'specrouter_session_resident\{backend="sim2",what="sessions"\}') == 0
