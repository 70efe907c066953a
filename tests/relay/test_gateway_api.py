"""The public API end to end: real simulated vLLM, real gateway over TLS, the openai SDK."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from loadtests.harness.gateway import OTHER_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
MESSAGES = [{"role": "user", "content": "Write a function that parses `src/app/main.py`."}]


@pytest.fixture(scope="module")
def stack(certs) -> Iterator[tuple[GatewayServer, SimServer, SimServer]]:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.02) as coder,
        SimServer("embed", served_model_name="embed-small", time_scale=0.02) as emb,
    ):
        policy = coder_policy({"coder-a": coder.url}, embed={"embed-small": emb.url})
        with GatewayServer(policy, certs=certs, args=("--max-body-bytes", "65536")) as gw:
            yield gw, coder, emb


def test_chat_streaming_with_the_openai_sdk(stack) -> None:
    gw, _, _ = stack
    client = gw.openai()
    stream = client.chat.completions.create(
        model="coder", messages=MESSAGES, stream=True, max_tokens=40, seed=3
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason in {"stop", "length"}
    assert all(c.model == "coder" for c in chunks)  # the name the client asked for
    assert all(c.usage is None for c in chunks)  # the client did not ask for usage


def test_chat_not_streaming(stack) -> None:
    gw, _, _ = stack
    resp = gw.openai().chat.completions.with_raw_response.create(
        model=SERVED, messages=MESSAGES, max_tokens=16
    )
    completion = resp.parse()
    assert completion.choices[0].message.content
    assert completion.usage is not None and completion.usage.completion_tokens <= 16
    assert completion.model == SERVED
    assert resp.headers["x-specrouter-variant"] == "coder-a"
    assert resp.headers["x-specrouter-defaults"] == "temperature=0.7"
    assert resp.headers["x-request-id"]


def test_completions_streaming_and_not(stack) -> None:
    gw, _, _ = stack
    client = gw.openai()
    chunks = list(
        client.completions.create(model="coder", prompt="def f(", max_tokens=12, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    plain = client.completions.create(model="coder", prompt="def f(", max_tokens=12)
    assert plain.choices[0].text and plain.model == "coder"


def test_embeddings_and_models(stack) -> None:
    gw, _, _ = stack
    client = gw.openai()
    out = client.embeddings.create(model="embed-small", input=["a", "b"])
    assert len(out.data) == 2 and len(out.data[0].embedding) > 8
    names = {m.id for m in client.models.list()}
    assert names == {"coder", SERVED, "embed-small"}


def test_models_carry_each_names_window_as_its_engine_reports_it(stack) -> None:
    gw, coder, emb = stack
    engine = httpx.get(f"{coder.url}/v1/models").json()["data"][0]["max_model_len"]
    embed = httpx.get(f"{emb.url}/v1/models").json()["data"][0]["max_model_len"]
    with gw.client() as c:
        for _ in range(100):  # the health checker reads the engines' lists (every 2 s)
            listed = c.get("/v1/models").json()
            windows = {m["id"]: m["max_model_len"] for m in listed["data"]}
            if None not in windows.values():
                break
            time.sleep(0.1)
        one = c.get(f"/v1/models/{SERVED}").json()
    assert windows == {"coder": engine, SERVED: engine, "embed-small": embed}
    assert listed["first_token_limit_s"] == 30 + 300  # the queue's wait, the first byte's
    assert one["max_model_len"] == engine


def test_embeddings_only_reach_embedding_backends(stack) -> None:
    gw, _, _ = stack
    with pytest.raises(openai.BadRequestError):
        gw.openai().embeddings.create(model="coder", input="x")
    with pytest.raises(openai.BadRequestError):
        gw.openai().chat.completions.create(model="embed-small", messages=MESSAGES)


def test_responses_keeps_event_lines(stack) -> None:
    gw, _, _ = stack
    with (
        gw.client() as c,
        c.stream(
            "POST",
            "/v1/responses",
            json={
                "model": "coder",
                "input": "Write hello world in C.",
                "stream": True,
                "max_output_tokens": 16,
            },
        ) as r,
    ):
        assert r.status_code == 200
        body = r.read()
    assert body.startswith(b"event: response.created\ndata: ")
    assert b"[DONE]" not in body and b"event: error" not in body
    last = body.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert last.startswith((b"event: response.completed", b"event: response.incomplete"))
    events = list(
        gw.openai().responses.create(model="coder", input="hi", stream=True, max_output_tokens=8)
    )
    assert events[-1].type in {"response.completed", "response.incomplete"}


def test_defaults_only_when_absent(stack) -> None:
    gw, _, _ = stack
    with gw.client() as c:
        set_by_client = c.post(
            "/v1/chat/completions",
            json={"model": "coder", "messages": MESSAGES, "max_tokens": 4, "temperature": 1.0},
        )
        unset = c.post(
            "/v1/chat/completions", json={"model": "coder", "messages": MESSAGES, "max_tokens": 4}
        )
    assert set_by_client.status_code == unset.status_code == 200
    assert "x-specrouter-defaults" not in set_by_client.headers
    assert unset.headers["x-specrouter-defaults"] == "temperature=0.7"
    metrics = gw.metrics()
    assert re.search(
        r'specrouter_defaults_applied_total\{field="temperature",route="coder"\} '
        r"[1-9]",
        metrics,
    )


@pytest.mark.parametrize(
    ("key", "body", "status", "etype"),
    [
        ("wrong-key", {"model": "coder"}, 401, "AuthenticationError"),
        (None, b"{not json", 400, "BadRequestError"),
        (None, b"[1, 2]", 400, "BadRequestError"),
        (None, {"messages": []}, 400, "BadRequestError"),
        (None, {"model": "gpt-nope", "messages": []}, 404, "NotFoundError"),
        (None, {"model": "coder", "messages": [], "pad": "x" * 70_000}, 413, None),
    ],
)
def test_bad_input_gets_an_openai_error(stack, key, body, status, etype) -> None:
    gw, _, _ = stack
    with gw.client(**({} if key is None else {"key": key})) as c:
        if isinstance(body, bytes):
            r = c.post(
                "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
            )
        else:
            r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == status
    err = r.json()["error"]
    assert err["message"]
    if etype:
        assert err["type"] == etype
    if status == 404:
        assert "coder" in err["message"]  # names the available models


def test_every_client_of_the_policy_is_served(stack) -> None:
    gw, _, _ = stack
    with gw.client(key=OTHER_KEY) as c:
        r = c.post(
            "/v1/chat/completions", json={"model": "coder", "messages": MESSAGES, "max_tokens": 2}
        )
    assert r.status_code == 200


def test_health_endpoints(stack) -> None:
    gw, _, _ = stack
    with gw.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").json()["ready"] is True
        assert c.get("/metrics").status_code == 404  # metrics only on the admin listener
    assert httpx.get(gw.admin + "/admin/status").status_code == 401
