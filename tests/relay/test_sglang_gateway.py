"""A `kind: sglang` backend behind the gateway, in front of an engine that answers with SGLang's
own bytes (tests/relay/sglang_playback.py): the client gets SGLang's answer to its own request,
byte for byte, while the gateway asked for continuous usage and the spec figures and logged
tokens per step from SGLang's `spec_verify_ct`. A failing SGLang variant falls back to another, and
a client that leaves mid-stream gets the engine's connection closed (SGLang's abort)."""

from __future__ import annotations

import copy
import re
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from proxy.certs import CertFiles
from tests.relay.sglang_playback import GOLDEN, SglangPlayback

MODEL = "qwen-tiny"  # the fixtures' served name
PATHS = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
INPUTS: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "completions": {"prompt": "hi"},
    "messages": {"messages": [{"role": "user", "content": "hi"}]},
    "responses": {"input": "hi"},
}


FAILOVER = "qwen-tiny-fo"  # a second route: the failing engine first, then the good one
CONTINUABLE = "qwen-tiny-cont"  # a route whose streams another variant may finish
CONTINUED = "qwen-tiny-cont-fo"  # the same, its first engine dying three frames in


@pytest.fixture(scope="module")
def broken() -> Iterator[SglangPlayback]:
    with SglangPlayback(fail=True) as engine:
        yield engine


@pytest.fixture(scope="module")
def dying() -> Iterator[SglangPlayback]:
    with SglangPlayback(dies_after=3) as engine:  # the role frame, "Hello", ", world"
        yield engine


@pytest.fixture(scope="module")
def stack(
    certs: CertFiles, broken: SglangPlayback, dying: SglangPlayback
) -> Iterator[tuple[SglangPlayback, GatewayServer]]:
    with SglangPlayback() as engine:
        doc = coder_policy({"sg": engine.url}, served=MODEL, defaults={})
        doc["backends"]["sg"]["kind"] = "sglang"
        doc["backends"]["sg-broken"] = {**doc["backends"]["sg"], "url": broken.url}
        doc["backends"]["sg-dies"] = {**doc["backends"]["sg"], "url": dying.url}
        for name, model, variants, more in (
            ("failover", FAILOVER, ["sg-broken", "sg"], {}),
            ("continuable", CONTINUABLE, ["sg"], {"continuation": True}),
            ("continued", CONTINUED, ["sg-dies", "sg"], {"continuation": True}),
        ):
            route = copy.deepcopy(doc["routes"]["coder"])
            route.update(models=[model], variants=variants, fallback="sg", **more)
            doc["routes"][name] = route
        with GatewayServer(doc, certs=certs) as gw:
            yield engine, gw


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("shape", ["stream_plain", "stream_usage"])
def test_streams_byte_for_byte_and_measured(
    stack: tuple[SglangPlayback, GatewayServer], endpoint: str, shape: str
) -> None:
    engine, gw = stack
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "temperature": 0, "stream": True}
    if shape == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    rid = f"sg-{endpoint}-{shape}"
    with gw.client() as c:
        r = c.post(
            PATHS[endpoint], json={**body, **INPUTS[endpoint]}, headers={"x-request-id": rid}
        )
    assert r.status_code == 200
    assert r.content == (GOLDEN / f"{endpoint}_{shape}.sse").read_bytes()
    sent = engine.bodies[-1]
    assert sent["return_spec_tokens_details"] is True
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    row = logged_rows(gw.dir / "state", {rid})[rid]
    assert row["completion_tokens"] == 8
    assert row["tps_source"] == "engine"
    assert row["tokens_per_step"] == pytest.approx(7 / 3)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_body_is_relayed_as_sglang_wrote_it_and_measured(
    stack: tuple[SglangPlayback, GatewayServer], endpoint: str
) -> None:
    """The gateway asks the spec figures on a body too and cuts them as the body passes."""
    engine, gw = stack
    body = {"model": MODEL, "max_tokens": 16, "temperature": 0, **INPUTS[endpoint]}
    rid = f"sg-{endpoint}-body"
    with gw.client() as c:
        r = c.post(PATHS[endpoint], json=body, headers={"x-request-id": rid})
    assert r.status_code == 200
    assert r.content == (GOLDEN / f"{endpoint}_full_plain.json").read_bytes()
    assert engine.bodies[-1]["return_spec_tokens_details"] is True
    row = logged_rows(gw.dir / "state", {rid})[rid]
    assert (row["completion_tokens"], row["tps_source"]) == (8, "engine")
    assert row["tokens_per_step"] == pytest.approx(7 / 3)


def test_a_client_that_asked_gets_the_figures_in_its_body(
    stack: tuple[SglangPlayback, GatewayServer],
) -> None:
    _, gw = stack
    body = {"model": MODEL, "max_tokens": 16, "return_spec_tokens_details": True}
    with gw.client() as c:
        r = c.post(PATHS["chat"], json={**body, **INPUTS["chat"]})
    assert r.content == (GOLDEN / "chat_full_asked.json").read_bytes()


@pytest.mark.parametrize("shape", ["stream_plain", "stream_usage"])
def test_a_continuable_stream_is_measured_and_cut(
    stack: tuple[SglangPlayback, GatewayServer], shape: str
) -> None:
    """A stream another variant may finish is asked and cut as any other."""
    engine, gw = stack
    body: dict[str, Any] = {"model": CONTINUABLE, "max_tokens": 16, "stream": True}
    if shape == "stream_usage":
        body["stream_options"] = {"include_usage": True}
    rid = f"sg-cont-{shape}"
    with gw.client() as c:
        r = c.post(PATHS["chat"], json={**body, **INPUTS["chat"]}, headers={"x-request-id": rid})
    want = (GOLDEN / f"chat_{shape}.sse").read_bytes()
    assert r.content == want.replace(b'"model":"qwen-tiny"', b'"model":"qwen-tiny-cont"')
    assert engine.bodies[-1]["return_spec_tokens_details"] is True
    row = logged_rows(gw.dir / "state", {rid})[rid]
    assert (row["tps_source"], row["tokens_per_step"]) == ("engine", pytest.approx(7 / 3))


def test_a_continued_stream_gets_no_spec_frame_and_one_role(
    stack: tuple[SglangPlayback, GatewayServer], dying: SglangPlayback
) -> None:
    """The first engine dies three frames in; the second finishes the answer. Both were asked
    the spec figures; neither's reaches the client, nor the second's role frame."""
    engine, gw = stack
    body = {"model": CONTINUED, "max_tokens": 16, "stream": True, **INPUTS["chat"]}
    rid = "sg-continued"
    with gw.client() as c:
        r = c.post(PATHS["chat"], json=body, headers={"x-request-id": rid})
    assert r.headers["x-specrouter-variant"] == "sg-dies"  # the response began there
    frames = [orjson.loads(f[6:]) for f in r.content.split(b"\n\n") if f.startswith(b"data: {")]
    assert all("sglext" not in f and "usage" not in f for f in frames)
    assert sum("role" in f["choices"][0]["delta"] for f in frames) == 1
    text = "".join(f["choices"][0]["delta"].get("content") or "" for f in frames)
    assert text == "Hello, world" + "Hello, world! How are you?"  # the playback ignores the prefix
    assert r.content.endswith(b"data: [DONE]\n\n")
    assert dying.bodies[-1]["return_spec_tokens_details"] is True
    sent = engine.bodies[-1]
    assert sent["return_spec_tokens_details"] is True and sent["continue_final_message"] is True
    row = logged_rows(gw.dir / "state", {rid})[rid]
    assert (row["completion_tokens"], row["tps_source"]) == (11, "engine")


def test_scraped_and_re_exported(stack: tuple[SglangPlayback, GatewayServer]) -> None:
    """SGLang's totals (not its per-priority counts) under the gateway's backend families."""
    _, gw = stack
    want = (
        'specrouter_backend_running{backend="sg"} 2.0',
        'specrouter_backend_waiting{backend="sg"} 1.0',
        'specrouter_backend_spec_drafts_total{backend="sg"} 6.0',
    )
    deadline = time.monotonic() + 10.0  # the first scrape comes within the scrape interval
    while not all(w in (text := gw.admin_get("/metrics").text) for w in want):
        assert time.monotonic() < deadline, text
        time.sleep(0.1)
    # SGLang's /health answers after its one-second poll: the check waits for it, so the
    # backend stays up (with the scrape interval's timeout alone it fell back to starting).
    assert 'specrouter_backend_up{backend="sg",health="up"} 1.0' in text


def test_a_failing_sglang_variant_falls_back(
    stack: tuple[SglangPlayback, GatewayServer], broken: SglangPlayback
) -> None:
    """SGLang's 500 (its serving code's answer to a request that raised) before any byte: the
    request goes to the route's other SGLang engine, and the client gets that one's answer."""
    _, gw = stack
    tried = len(broken.bodies)
    body = {"model": FAILOVER, "max_tokens": 16, "temperature": 0, **INPUTS["chat"]}
    with gw.client() as c:
        r = c.post(PATHS["chat"], json=body)
    assert r.status_code == 200, r.text
    assert r.headers["x-specrouter-variant"] == "sg"
    want = (GOLDEN / "chat_full_plain.json").read_bytes()  # named as the client named it
    assert r.content == want.replace(b'"model":"qwen-tiny"', b'"model":"qwen-tiny-fo"')
    assert len(broken.bodies) == tried + 1  # it was asked first
    assert re.search(
        r'specrouter_upstream_errors_total\{backend="sg-broken"[^}]*\} 1', gw.metrics()
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_client_that_leaves_gets_the_sglang_request_aborted(
    stack: tuple[SglangPlayback, GatewayServer], endpoint: str
) -> None:
    """SGLang aborts a request when its HTTP connection closes (it polls `is_disconnected` and
    its streaming response's background task aborts the rid), so the gateway must close the
    engine's connection when its client leaves mid-stream."""
    engine, gw = stack
    engine.aborted.clear()
    body = {"model": MODEL, "max_tokens": 4000, "stream": True, **INPUTS[endpoint]}
    with gw.client() as c, c.stream("POST", PATHS[endpoint], json=body) as r:
        assert r.status_code == 200
        for i, _ in enumerate(r.iter_lines()):
            if i > 8:
                break
    assert engine.aborted.wait(10.0)


@pytest.mark.parametrize("endpoint", ["messages", "responses"])
@pytest.mark.parametrize("stream", [True, False])
def test_messages_and_responses_go_to_sglang_as_sent(
    stack: tuple[SglangPlayback, GatewayServer], endpoint: str, stream: bool
) -> None:
    """SGLang serves both APIs itself (its `AnthropicServing` over its chat serving, its
    `OpenAIServingResponses`): the request goes as the client sent it (neither has a field for
    the spec figures) and the client gets SGLang's bytes; a stream's tokens per step are the
    gateway's request average, one step per token event after the first, as on vLLM."""
    engine, gw = stack
    limit = "max_tokens" if endpoint == "messages" else "max_output_tokens"
    body = {"model": MODEL, limit: 16, "temperature": 0, "stream": stream, **INPUTS[endpoint]}
    rid = f"sg-{endpoint}-{stream}"
    with gw.client() as c:
        r = c.post(PATHS[endpoint], json=body, headers={"x-request-id": rid})
    assert r.status_code == 200, r.text
    name = f"{endpoint}_stream.sse" if stream else f"{endpoint}_full.json"
    assert r.content == (GOLDEN / name).read_bytes()
    assert engine.bodies[-1] == body
    row = logged_rows(gw.dir / "state", {rid})[rid]
    assert row["completion_tokens"] == 8
    if stream:  # 4 token events: the prefill's and 3 decode steps
        assert (row["tps_source"], row["tokens_per_step"]) == ("average", pytest.approx(7 / 3))
    else:
        assert row["tps_source"] in (None, "")
