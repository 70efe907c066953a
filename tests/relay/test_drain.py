"""TERM with agents connected: the gateway finishes what is in flight and exits, without
waiting for pooled TLS connections to answer its `close_notify` (proxy/drain_close.py)."""

from __future__ import annotations

import signal
import subprocess

import httpx

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
# Far beyond what the test waits: an exit that waited for the drain's deadline fails it.
DRAIN_S = 120
# asyncio's and uvloop's wait for a client's `close_notify` is 30 s: the exit comes before it.
EXIT_WITHIN_S = 20


def _open_stream(client: httpx.Client) -> httpx.Response:
    body = {
        "model": "coder",
        "stream": True,
        "max_tokens": 60,
        "ignore_eos": True,
        "messages": [{"role": "user", "content": "Write `drain.py`."}],
    }
    request = client.build_request("POST", "/v1/chat/completions", json=body)
    return client.send(request, stream=True)


def test_term_exits_once_streams_end_though_clients_keep_their_connections(certs) -> None:
    with (
        SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.2) as coder,
        GatewayServer(
            coder_policy({"coder-a": coder.url}),
            certs=certs,
            args=("--drain-timeout", str(DRAIN_S)),
        ) as gw,
        gw.client() as idle,
        gw.client() as streaming,
    ):
        assert idle.get("/healthz").status_code == 200  # its connection stays in the pool
        response = _open_stream(streaming)
        events = response.iter_lines()
        lines = [next(events)]
        assert gw.proc is not None
        gw.proc.send_signal(signal.SIGTERM)
        lines += list(events)  # the stream in flight ends whole...
        response.close()  # ...and its connection goes back to the pool, never read again
        try:
            rc = gw.proc.wait(timeout=EXIT_WITHIN_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"still running {EXIT_WITHIN_S}s after TERM with two idle TLS clients"
            ) from None
    assert response.status_code == 200
    events_seen = [line for line in lines if line]
    assert events_seen[-1] == "data: [DONE]", events_seen[-3:]
    assert sum(line.startswith("data: {") for line in events_seen) > 10, events_seen[:5]
    assert rc == 0, "".join(gw.output[-20:])
