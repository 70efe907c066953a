"""Keys: the client's never goes upstream, the backend's own key is injected, none is logged."""

from __future__ import annotations

import httpx

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer, coder_policy
from loadtests.harness.sim import SimServer

BACKEND_KEY = "sk-backend-only"


def test_backend_key_replaces_the_client_key(certs, monkeypatch) -> None:
    monkeypatch.setenv("CODER_API_KEY", BACKEND_KEY)
    with SimServer(
        "mtp3",
        served_model_name="qwen3.8-27b",
        time_scale=0.02,
        extra_args=("--api-key", BACKEND_KEY),
    ) as sim:
        # The engine refuses the client's key: had the gateway forwarded it, requests fail.
        direct = httpx.post(
            sim.url + "/v1/chat/completions",
            timeout=10,
            headers={"authorization": f"Bearer {CLIENT_KEY}"},
            json={"model": "qwen3.8-27b", "messages": []},
        )
        assert direct.status_code == 401
        policy = coder_policy({"a": sim.url})
        policy["backends"]["a"]["api_key"] = "coder-key"  # defined by the operator, not here
        operator = {"secrets": {"coder-key": {"env": "CODER_API_KEY"}}}
        with GatewayServer(policy, certs=certs, operator=operator) as gw:
            with gw.client() as c:
                r = c.post(
                    "/v1/chat/completions",
                    json={
                        "model": "coder",
                        "max_tokens": 2,
                        "messages": [{"role": "user", "content": "hi"}],
                    },
                )
            assert r.status_code == 200
            with gw.client(key="sk-wrong") as c:
                assert c.get("/v1/models").status_code == 401
            logs = "".join(gw.output)
            metrics = gw.metrics()
        for secret in (CLIENT_KEY, BACKEND_KEY, "sk-wrong"):
            assert secret not in logs and secret not in metrics
