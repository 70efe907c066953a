"""The relay's promises: byte-identical streams, retries before the first byte, error events
after it, upstream aborts on disconnect, acceptance that matches the engine's counters."""

from __future__ import annotations

import re
import shutil
import socket
import ssl
import threading
import time
from pathlib import Path

import httpx
import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer
from proxy.certs import make_local_ca
from tests.stacks import Stacks, sim_gateway

SERVED = "qwen3.8-27b"
MESSAGES = [{"role": "user", "content": "Implement quicksort in `sort.py`."}]
_CREATED = re.compile(rb'"created":\d+')


def _normalise(body: bytes) -> bytes:
    return _CREATED.sub(b'"created":0', body)


def _stream(client: httpx.Client, url: str, body: dict, rid: str, **headers: str) -> bytes:
    with client.stream("POST", url, json=body, headers={"x-request-id": rid, **headers}) as r:
        assert r.status_code == 200, r.read()
        return r.read()


# The sim's version modes: 0.33 chunks end with "kv_transfer_params":null, which the
# fingerprint the gateway moves back must precede; the summary is a 0.29+ flag.
VERSION_MODES = [("0.28.0", "none"), ("0.33.0", "none"), ("0.33.0", "summary")]


@pytest.mark.parametrize(
    "stream_options",
    [
        None,
        {"include_usage": True},
        {"include_usage": True, "continuous_usage_stats": True},
        {"include_usage": False},
    ],
)
@pytest.mark.parametrize(("vllm_version", "spec_metrics"), VERSION_MODES)
@pytest.mark.parametrize("relay", ["push", "pull"])
def test_relayed_stream_is_byte_identical_to_direct(
    certs, stacks: Stacks, stream_options, vllm_version, spec_metrics, relay
) -> None:
    # One stack per (version mode, relay), shared by the four stream_options cases.
    stack = stacks.get(
        (vllm_version, spec_metrics, relay),
        lambda: sim_gateway(
            certs,
            sim={
                "profile": "dflash7-prob-block",
                "served_model_name": SERVED,
                "time_scale": 0.02,
                "spec_metrics": spec_metrics,
                "vllm_version": vllm_version,
            },
            policy={"defaults": {}},
            args=("--relay", relay),
        ),
    )
    sim, gw = stack.sim, stack.gw
    body: dict = {
        "model": SERVED,
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": 48,
        "seed": 7,
        "temperature": 0.7,
    }
    if stream_options is not None:
        body["stream_options"] = stream_options
    with httpx.Client(timeout=30) as direct, gw.client() as via:
        want = _stream(direct, sim.url + "/v1/chat/completions", body, "req-1")
        got = _stream(via, "/v1/chat/completions", body, "req-1")
    assert _normalise(got) == _normalise(want)
    assert got.endswith(b"data: [DONE]\n\n")


@pytest.mark.parametrize("vllm_version", ["0.28.0", "0.33.0"])
def test_completions_stream_is_byte_identical(certs, vllm_version) -> None:
    with (
        SimServer(
            "mtp3", served_model_name=SERVED, time_scale=0.02, vllm_version=vllm_version
        ) as sim,
        GatewayServer(coder_policy({"a": sim.url}, defaults={}), certs=certs) as gw,
    ):
        body = {
            "model": SERVED,
            "prompt": "def parse(",
            "stream": True,
            "max_tokens": 30,
            "seed": 1,
        }
        with httpx.Client(timeout=30) as direct, gw.client() as via:
            want = _stream(direct, sim.url + "/v1/completions", body, "req-2")
            got = _stream(via, "/v1/completions", body, "req-2")
        assert _normalise(got) == _normalise(want)


def test_retry_on_another_backend_before_the_first_byte(certs) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.02) as a,
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as b,
        GatewayServer(coder_policy({"a": a.url, "b": b.url}), certs=certs) as gw,
    ):
        a.fault("http_503")
        with gw.client() as c:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "coder", "messages": MESSAGES, "max_tokens": 8},
            )
        assert r.status_code == 200
        assert r.headers["x-specrouter-variant"] == "b"
        a.clear_faults()
        a.kill()  # connection refused now
        with gw.client() as c:
            r = c.post(
                "/v1/chat/completions",
                json={"model": "coder", "messages": MESSAGES, "max_tokens": 8, "stream": True},
            )
        assert r.status_code == 200 and r.headers["x-specrouter-variant"] == "b"
        assert r.text.endswith("data: [DONE]\n\n")
        assert 'specrouter_retries_total{backend="b",route="coder"}' in gw.metrics()


def test_no_backend_left_gives_503_with_retry_after(certs) -> None:
    with (
        SimServer("mtp3", served_model_name=SERVED, time_scale=0.02) as a,
        GatewayServer(coder_policy({"a": a.url}), certs=certs) as gw,
    ):
        a.fault("http_503")
        with gw.client() as c:
            r = c.post("/v1/chat/completions", json={"model": "coder", "messages": MESSAGES})
        assert r.status_code == 503
        assert r.headers["retry-after"] and r.headers["x-should-retry"] == "true"
        assert r.json()["error"]["code"] == 503


@pytest.mark.parametrize("relay", ["push", "pull"])
def test_backend_death_mid_stream_ends_with_an_error_event(certs, relay) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs, args=("--relay", relay)) as gw,
    ):
        sim.fault("die_mid_stream", after_chunks=4)
        with gw.client() as c:
            body = _stream(
                c,
                "/v1/chat/completions",
                {"model": "coder", "messages": MESSAGES, "stream": True, "max_tokens": 400},
                "req-die",
            )
        frames = body.split(b"\n\n")
        assert frames[-1] == b""
        assert frames[-2] == b"data: [DONE]"
        assert frames[-3].startswith(b'data: {"error": {')
        assert b"chat.completion.chunk" in frames[0]
        assert 'outcome="upstream_error"' in gw.metrics()


def _wait_for(predicate, timeout: float = 5.0) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(0.01)
    raise AssertionError("condition not reached")


@pytest.mark.parametrize("relay", ["push", "pull"])
def test_client_disconnect_mid_stream_aborts_upstream(certs, relay) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.2) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs, args=("--relay", relay)) as gw,
    ):
        before = sim.stats()["aborted"]
        with (
            gw.client() as c,
            c.stream(
                "POST",
                "/v1/chat/completions",
                json={"model": "coder", "messages": MESSAGES, "stream": True, "max_tokens": 2000},
            ) as r,
        ):
            it = r.iter_raw()
            for _ in range(3):
                next(it)
        _wait_for(lambda: sim.stats()["aborted"] > before)
        _wait_for(lambda: sim.stats()["running"] == 0)
        _wait_for(lambda: 'outcome="client_gone"' in gw.metrics())
        assert re.search(r"specrouter_in_flight\{[^}]*\} 0\.0", gw.metrics())


def test_client_disconnect_while_waiting_for_the_first_byte(certs) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.5) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs) as gw,
    ):
        before = sim.stats()["aborted"]
        long_prompt = "x = 1\n" * 40_000  # a long prefill: seconds before the first token
        ctx = ssl.create_default_context(cafile=str(gw.certs.ca_cert))
        host, port = gw.base.removeprefix("https://").rsplit(":", 1)
        import orjson

        payload = orjson.dumps(
            {
                "model": "coder",
                "stream": True,
                "max_tokens": 10,
                "messages": [{"role": "user", "content": long_prompt}],
            }
        )
        with (
            socket.create_connection((host, int(port))) as raw,
            ctx.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            tls.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                b"authorization: Bearer "
                + CLIENT_KEY.encode()
                + b"\r\ncontent-type: application/json\r\ncontent-length: "
                + str(len(payload)).encode()
                + b"\r\n\r\n"
                + payload
            )
            _wait_for(lambda: sim.stats()["requests"] > 0)
        _wait_for(lambda: sim.stats()["aborted"] > before)


def _counter(text: str, name: str) -> float:
    return sum(
        float(m.group(1))
        for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    )


@pytest.mark.parametrize("spec_metrics", ["none", "summary"])
def test_recorded_acceptance_matches_engine_counters(certs, spec_metrics) -> None:
    with (
        SimServer(
            "dflash7-prob-block",
            served_model_name=SERVED,
            time_scale=0.02,
            spec_metrics=spec_metrics,
        ) as sim,
        GatewayServer(coder_policy({"a": sim.url}), certs=certs) as gw,
    ):
        engine_before = httpx.get(sim.url + "/metrics").text

        def one(i: int) -> None:
            with gw.client() as c:
                _stream(
                    c,
                    "/v1/chat/completions",
                    {
                        "model": "coder",
                        "messages": [{"role": "user", "content": f"task {i}"}],
                        "stream": True,
                        "max_tokens": 120,
                        "seed": i,
                    },
                    f"acc-{i}",
                )

        threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
        for batch in range(0, 50, 8):
            for t in threads[batch : batch + 8]:
                t.start()
            for t in threads[batch : batch + 8]:
                t.join()
        engine_after = httpx.get(sim.url + "/metrics").text
        drafts = _counter(engine_after, "vllm:spec_decode_num_drafts_total") - _counter(
            engine_before, "vllm:spec_decode_num_drafts_total"
        )
        generated = _counter(engine_after, "vllm:generation_tokens_total") - _counter(
            engine_before, "vllm:generation_tokens_total"
        )
        # The one definition (proxy/record/steps.py): (tokens - 1) / decode steps per request,
        # pooled; this engine drafts at every decode step, so its drafts are its decode steps.
        engine = (generated - 50) / drafts
        gm = gw.metrics()
        steps = _counter(gm, "specrouter_spec_steps_total")
        gateway = 1 + _counter(gm, "specrouter_spec_accepted_tokens_total") / steps
        assert gateway == pytest.approx(engine, rel=0.01)
        assert _counter(gm, "specrouter_requests_total") == 50


def test_sighup_reloads_the_certificate_without_dropping_a_stream(tmp_path: Path) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.3) as sim,
        GatewayServer(coder_policy({"a": sim.url})) as gw,
    ):
        host, port = gw.base.removeprefix("https://").rsplit(":", 1)

        def serial(cafile: Path) -> int:
            ctx = ssl.create_default_context(cafile=str(cafile))
            with (
                socket.create_connection((host, int(port))) as raw,
                ctx.wrap_socket(raw, server_hostname="localhost") as tls,
            ):
                der = tls.getpeercert(binary_form=True)
            from cryptography import x509

            return x509.load_der_x509_certificate(der).serial_number

        old_serial = serial(gw.certs.ca_cert)
        renewed = make_local_ca(tmp_path / "renewed", reuse=False)
        result: dict = {}

        def long_stream() -> None:
            with gw.client() as c:
                result["body"] = _stream(
                    c,
                    "/v1/chat/completions",
                    {"model": "coder", "messages": MESSAGES, "stream": True, "max_tokens": 300},
                    "hup",
                )

        t = threading.Thread(target=long_stream)
        t.start()
        time.sleep(0.5)
        shutil.copy(renewed.cert, gw.certs.cert)
        shutil.copy(renewed.key, gw.certs.key)
        gw.hup()
        _wait_for(lambda: _try_serial(serial, renewed.ca_cert) not in (None, old_serial))
        t.join(timeout=60)
        assert result["body"].endswith(b"data: [DONE]\n\n")
        assert b'"error"' not in result["body"]


def _try_serial(fn, cafile):
    try:
        return fn(cafile)
    except (ssl.SSLError, OSError):
        return None
