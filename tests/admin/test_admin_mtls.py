"""Optional client-certificate authentication on the admin listener."""

from __future__ import annotations

import ssl

import httpx
import pytest

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer, coder_policy
from proxy.certs import make_client_ca


def test_admin_listener_requires_a_client_certificate(certs, tmp_path) -> None:
    client = make_client_ca(tmp_path / "clients")
    with GatewayServer(
        coder_policy({"a": "http://127.0.0.1:9"}),
        certs=certs,
        args=("--admin-client-ca", str(client.ca_cert)),
    ) as gw:
        assert gw.admin.startswith("https://")
        anonymous = ssl.create_default_context(cafile=str(certs.ca_cert))
        with pytest.raises(httpx.HTTPError):
            httpx.get(gw.admin + "/metrics", verify=anonymous, timeout=5)
        holder = ssl.create_default_context(cafile=str(certs.ca_cert))
        holder.load_cert_chain(str(client.cert), str(client.key))
        r = httpx.get(
            gw.admin + "/admin/status",
            verify=holder,
            timeout=5,
            headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert r.status_code == 200
        # The certificate is a second factor, not a replacement for the token.
        assert httpx.get(gw.admin + "/admin/status", verify=holder, timeout=5).status_code == 401
