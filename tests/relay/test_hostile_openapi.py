"""Hostile input against the real gateway: schemathesis from the served /openapi.json, and a
table of hand-made malformed requests.

One gateway over TLS (the test CA, a bearer key) in front of two simulated vLLM backends (a
coder and an embedder) serves every case. Each request has a hard timeout; every answer must be
a 2xx or an OpenAI-style 4xx (`{"error": {"message", "type", "param", "code"}}`), never a 5xx,
never a hang. Generation is derandomized and bounded, so CI sees the same cases every run.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import time
from collections.abc import Iterator
from typing import Any

import httpx
import hypothesis.strategies as st
import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ignored_auth,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.hostile import BAD_BODIES as _BAD
from loadtests.harness.hostile import MAX_BODY
from loadtests.harness.sim import SimServer
from proxy.certs import CertFiles
from proxy.relay.openapi import spec

SPEC = spec()  # the served description, built as the gateway builds it
SERVED = "qwen3.8-27b"
EMBED = "embedding-small"
# Per request: connect, then at most this long between two bytes of the answer.
TIMEOUT = (5.0, 15.0)
# And in all: a stream that trickles forever is a hang too.
WALL_S = 20.0
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}
# Examples per operation; SPECROUTER_FUZZ_SCALE=20 for a long hunt, same seed.
_SCALE = int(os.environ.get("SPECROUTER_FUZZ_SCALE", "1"))
EXAMPLES = {GenerationMode.NEGATIVE: 40 * _SCALE, GenerationMode.POSITIVE: 15 * _SCALE}

# Every operation the description declares, so a new endpoint is fuzzed as soon as it is there.
OPERATIONS = [(path, method.upper()) for path, item in SPEC["paths"].items() for method in item]
BODY_OPERATIONS = [(p, m) for p, m in OPERATIONS if m == "POST"]
KNOWN_MODEL = {"/v1/embeddings": EMBED}


@pytest.fixture(scope="module")
def gateway(certs: CertFiles) -> Iterator[GatewayServer]:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.002) as coder,
        SimServer("embed", served_model_name=EMBED, time_scale=0.002) as emb,
    ):
        policy = coder_policy({"coder-a": coder.url}, embed={EMBED: emb.url})
        with GatewayServer(
            policy,
            certs=certs,
            args=(
                "--max-body-bytes",
                str(MAX_BODY),
                "--first-byte-timeout",
                "10",
                "--idle-timeout",
                "10",
            ),
        ) as gw:
            yield gw


@pytest.fixture(scope="module")
def session(gateway: GatewayServer) -> Iterator[requests.Session]:
    with requests.Session() as s:
        s.verify = str(gateway.certs.ca_cert)
        yield s


@pytest.fixture(scope="module")
def schema(gateway: GatewayServer) -> Any:
    return schemathesis.openapi.from_url(
        gateway.base + "/openapi.json", verify=str(gateway.certs.ca_cert), timeout=10
    )


def test_the_served_description_is_the_module_spec(gateway: GatewayServer) -> None:
    ctx = ssl.create_default_context(cafile=str(gateway.certs.ca_cert))
    r = httpx.get(gateway.base + "/openapi.json", verify=ctx, timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json() == orjson.loads(orjson.dumps(SPEC))


def _with_model(path: str) -> Any:
    """Route a generated case to a real backend, so its other fields reach the backend too."""
    model = KNOWN_MODEL.get(path, "coder")

    def apply(case: Case[Any]) -> Case[Any]:
        if isinstance(case.body, dict):
            case.body = {**case.body, "model": model}
        return case

    return apply


# Fields that make the backend work for long (n=300000 takes the simulator minutes, as it would
# vLLM): capped before a case is sent, so the suite stays bounded.
_COSTLY = {"n": 2, "max_tokens": 32, "max_completion_tokens": 32, "max_output_tokens": 32}


def _too_costly(key: str, value: Any) -> bool:
    return key in _COSTLY and type(value) is int and value > _COSTLY[key]


def gateway_must_reject(body: Any) -> bool:
    """Malformed at the gateway's own level: not an object, or no non-empty string `model`."""
    if not isinstance(body, dict):
        return True
    model = body.get("model")
    return not isinstance(model, str) or not model


def assert_openai_error(status: int, content: bytes, path: str = "") -> dict[str, Any]:
    """OpenAI's error shape; on the Messages route the gateway's own errors are Anthropic's
    (checked, then returned as `message`/`type`/`code` for the callers' checks)."""
    assert 400 <= status < 500, status
    data = orjson.loads(content)
    if path.startswith("/v1/messages") and data.get("type") == "error":
        anth: dict[str, Any] = data["error"]
        assert list(data) == ["type", "error"] and list(anth) == ["type", "message"], data
        assert isinstance(anth["message"], str) and anth["message"], data
        code = "invalid_api_key" if anth["type"] == "authentication_error" else status
        return {**anth, "param": None, "code": code}
    err: dict[str, Any] = data["error"]
    assert isinstance(err["message"], str) and err["message"], data
    assert isinstance(err["type"], str) and err["type"], data
    assert err["param"] is None or isinstance(err["param"], str), data
    assert isinstance(err["code"], int | str) or err["code"] is None, data
    return err


# The checks every answer must pass. Not `negative_data_rejection`/`positive_data_acceptance`:
# the gateway passes fields it does not read to the backend, and vLLM (pydantic, lax mode) takes
# `"stream": 0` or `"max_tokens": false`, and refuses `min_p` with speculative decoding: the
# description cannot say all of that, and it is the backend's to judge.
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
]


def exercise(
    case: Case[Any], gateway: GatewayServer, session: requests.Session, checks: list[Any] = CHECKS
) -> int:
    """Send one case with hard timeouts, run the checks, and the gateway's own promises."""
    kwargs: dict[str, Any] = {"timeout": TIMEOUT, "session": session, "verify": session.verify}
    if isinstance(case.body, dict) and any(_too_costly(k, v) for k, v in case.body.items()):
        case.body = {k: _COSTLY[k] if _too_costly(k, v) else v for k, v in case.body.items()}
    started = time.monotonic()
    response = case.call(base_url=gateway.base, headers=AUTH, **kwargs)
    elapsed = time.monotonic() - started
    assert elapsed < WALL_S, f"{case.operation.label} took {elapsed:.1f}s"
    case.validate_response(response, checks=checks, headers=AUTH, transport_kwargs=kwargs)
    if 400 <= response.status_code < 500:
        assert_openai_error(response.status_code, response.content, case.operation.path)
    if (
        case.method == "POST"
        and case.operation.method.upper() == "POST"
        and case.media_type == "application/json"
        and gateway_must_reject(case.body)
    ):
        # 400, or 401 when the case itself broke the credentials (checked first), or 413 when the
        # fuzzer made the body larger than --max-body-bytes (its size is checked before its JSON).
        allowed = {400, 401} | ({413} if _size(case.body) > MAX_BODY else set())
        assert response.status_code in allowed, (case.body, response.content)
    return response.status_code


def _size(body: object) -> int:
    """The bytes the case sends, as near as its body tells (a raw body, or JSON)."""
    if isinstance(body, bytes | bytearray):
        return len(body)
    try:
        return len(json.dumps(body))
    except (TypeError, ValueError):
        return 0


# Negative cases for every operation with a body; the GET operations take nothing to break.
FUZZ = [
    (p, m, mode)
    for p, m in OPERATIONS
    for mode in (GenerationMode.NEGATIVE, GenerationMode.POSITIVE)
    if m == "POST" or mode is GenerationMode.POSITIVE
]


@pytest.mark.parametrize(
    ("path", "method", "mode"), FUZZ, ids=[f"{m} {p} {mode}" for p, m, mode in FUZZ]
)
def test_fuzz_operation(
    schema: Any,
    session: requests.Session,
    gateway: GatewayServer,
    path: str,
    method: str,
    mode: GenerationMode,
) -> None:
    operation = schema[path][method]
    # Most cases carry the client's key, so they get past authentication; a third bring the
    # credentials schemathesis makes up. Of the keyed ones, half name a model the policy
    # serves, so the backend sees them too.
    keyed = operation.as_strategy(generation_mode=mode, headers=AUTH)
    strategy = st.one_of(keyed, operation.as_strategy(generation_mode=mode))
    if method == "POST":
        strategy = st.one_of(
            keyed, keyed.map(_with_model(path)), operation.as_strategy(generation_mode=mode)
        )
    seen: dict[int, int] = {}

    @settings(
        max_examples=EXAMPLES[mode],
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: Case[Any]) -> None:
        status = exercise(case, gateway, session)
        seen[status] = seen.get(status, 0) + 1

    run()
    print(f"{method} {path} {mode}: statuses {dict(sorted(seen.items()))}")


# -- hand-made malformed requests ----------------------------------------------------------------

_JSON_CT = {"content-type": "application/json"}
_BAD_IDS = [b[0] for b in _BAD]


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> Iterator[httpx.Client]:
    ctx = ssl.create_default_context(cafile=str(gateway.certs.ca_cert))
    with httpx.Client(
        base_url=gateway.base, verify=ctx, headers=AUTH, timeout=httpx.Timeout(15.0, connect=5.0)
    ) as c:
        yield c


@pytest.mark.parametrize(("what", "body", "headers", "status"), _BAD, ids=_BAD_IDS)
def test_malformed_chat_body(
    client: httpx.Client, what: str, body: bytes, headers: dict[bytes, bytes], status: int
) -> None:
    r = client.post(
        "/v1/chat/completions",
        content=body,
        headers={b"content-type": b"application/json", **headers},
    )
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert_openai_error(r.status_code, r.content)


@pytest.mark.parametrize("path", [p for p, _ in BODY_OPERATIONS])
@pytest.mark.parametrize(
    ("what", "body"),
    [
        ("not json", b"{"),
        ("array", b"[]"),
        ("no model", b"{}"),
        ("model number", b'{"model":1}'),
        ("invalid utf-8", b'{"model":"\xc3\x28"}'),
    ],
)
def test_malformed_body_on_every_endpoint(
    client: httpx.Client, path: str, what: str, body: bytes
) -> None:
    r = client.post(path, content=body, headers=_JSON_CT)
    assert r.status_code == 400, r.text
    assert_openai_error(r.status_code, r.content, path)


@pytest.mark.parametrize("path", [p for p, _ in OPERATIONS])
@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer",
        "Bearer wrong",
        "Basic Zm9vOmJhcg==",
        "bEaReR",
        "Token " + CLIENT_KEY,
        "Bearer " + "k" * 8000,
    ],
)
def test_bad_credentials(
    gateway: GatewayServer, client: httpx.Client, path: str, authorization: str | None
) -> None:
    method = "POST" if (path, "POST") in OPERATIONS else "GET"
    headers = {**_JSON_CT}
    r = client.build_request(
        method,
        path,
        content=b'{"model": "coder", "messages": []}' if method == "POST" else None,
        headers=headers,
    )
    if authorization is None:
        del r.headers["authorization"]
    else:
        r.headers["authorization"] = authorization
    resp = client.send(r)
    if SPEC["paths"][path][method.lower()].get("security") == []:
        assert resp.status_code in (200, 503), resp.text  # public: health, readiness, this
        return
    assert resp.status_code == 401, resp.text
    assert resp.headers["www-authenticate"] == "Bearer"
    err = assert_openai_error(resp.status_code, resp.content, path)
    assert err["code"] == "invalid_api_key"
    assert CLIENT_KEY not in resp.text


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/chat/completions", 405),
        ("PUT", "/v1/completions", 405),
        ("DELETE", "/v1/embeddings", 405),
        ("PATCH", "/v1/responses", 405),
        ("POST", "/v1/models", 405),
        ("DELETE", "/healthz", 405),
        ("PUT", "/readyz", 405),
        ("POST", "/openapi.json", 405),
        ("GET", "/v1/nothing", 404),
        ("POST", "/admin/policy", 404),
        ("GET", "/metrics", 404),
        ("GET", "/v1/chat/completions/../../metrics", 404),
        ("GET", "/%ff", 404),
    ],
)
def test_wrong_method_or_path(client: httpx.Client, method: str, path: str, status: int) -> None:
    r = client.request(method, path)
    assert r.status_code == status, r.text
    assert_openai_error(r.status_code, r.content)


def _coverage_cases(schema: Any, path: str, method: str) -> list[Case[Any]]:
    """Schemathesis's coverage phase: each field missing, of each wrong type, at its bounds,
    the content-type probes, and every undeclared method. Deterministic."""
    operation = schema[path][method]
    return list(
        schema.iter_coverage_cases(
            operation,
            generation_modes=[GenerationMode.NEGATIVE, GenerationMode.POSITIVE],
            generation_config=schema.config.generation_for(operation=operation),
        )
    )


@pytest.mark.parametrize(("path", "method"), OPERATIONS, ids=[f"{m} {p}" for p, m in OPERATIONS])
def test_coverage_operation(
    schema: Any, session: requests.Session, gateway: GatewayServer, path: str, method: str
) -> None:
    seen: dict[tuple[str, int], int] = {}
    failures: list[str] = []
    for case in _coverage_cases(schema, path, method):
        checks = CHECKS
        if case.method != method:  # an undeclared method: 405 with a matching Allow
            checks = [*CHECKS, unsupported_method, allow_header_conformance]
        try:
            status = exercise(case, gateway, session, checks)
        except (AssertionError, FailureGroup) as exc:
            failures.append(f"{case.method} {case.body!r:.300}: {exc}")
            continue
        seen[(case.method, status)] = seen.get((case.method, status), 0) + 1
    print(f"{method} {path} coverage: {dict(sorted(seen.items()))}")
    assert not failures, "\n\n".join(failures[:5])


# Not HTTP at all, or HTTP that cannot be framed: the server answers 400 before any route is
# read (uvicorn's plain-text 400, documented in the description) and closes. Never a hang.
_KEY = f"authorization: Bearer {CLIENT_KEY}\r\n".encode()
_RAW: dict[str, bytes] = {
    "garbage": b"GARBAGE\r\n\r\n",
    "tls record as http": b"\x16\x03\x01\x00\xff" * 10 + b"\r\n\r\n",
    "http/2 preface": b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    "content-length not a number": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    + _KEY
    + b"content-length: abc\r\n\r\n{}",
    "negative content-length": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    + _KEY
    + b"content-length: -5\r\n\r\n{}",
    "content-length and chunked": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    + _KEY
    + b"content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "bad chunk size": b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
    + _KEY
    + b"transfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
    "control byte in a header": b"GET /healthz HTTP/1.1\r\nhost: x\r\nx-a: \x01\r\n\r\n",
}


@pytest.mark.parametrize("raw", list(_RAW.values()), ids=list(_RAW))
def test_malformed_http_gets_a_400_and_a_closed_connection(
    gateway: GatewayServer, raw: bytes
) -> None:
    host, port = gateway.base.removeprefix("https://").rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=str(gateway.certs.ca_cert))
    started = time.monotonic()
    with (
        socket.create_connection((host, int(port)), timeout=10) as sock,
        ctx.wrap_socket(sock, server_hostname=host) as tls,
    ):
        tls.sendall(raw)
        answer = b""
        while chunk := tls.recv(65536):  # the server closes: recv gives b"" (or times out)
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
    assert time.monotonic() - started < 10


def test_the_gateway_is_still_healthy_after_the_abuse(client: httpx.Client) -> None:
    r = client.post(
        "/v1/chat/completions",
        json={"model": "coder", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "coder"
