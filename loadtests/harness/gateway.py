"""Run the real gateway (`specrouter serve`) as a subprocess on loopback, with real TLS."""

from __future__ import annotations

import os
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import httpx
import yaml

from proxy import auth
from proxy.certs import CertFiles, make_local_ca

_LINE = re.compile(r"specrouter listening on (\S+) admin (\S+)")
CLIENT_KEY = "sk-test-client"
OTHER_KEY = "sk-test-other"
# The gateway refuses an admin token under 32 characters.
ADMIN_TOKEN = "admin-test-token-of-thirty-two-chars"


def coder_policy(backends: dict[str, str], *, served: str = "qwen3.8-27b",
                 rules: list[dict[str, Any]] | None = None, embed: dict[str, str] | None = None,
                 defaults: dict[str, Any] | None = None, extra_clients: list[dict[str, Any]] | None = None
                 ) -> dict[str, Any]:
    """A policy: one coding route over `backends` (name -> URL, the first is the default)."""
    doc: dict[str, Any] = {
        "schema": 1,
        "backends": {name: {"url": url, "kind": "vllm", "task": "generate",
                            "served_model_name": served, "max_concurrency": 16}
                     for name, url in backends.items()},
        "routes": {"coder": {"models": ["coder", served], "task": "generate",
                             "variants": list(backends),
                             "defaults": {"temperature": 0.7} if defaults is None else defaults,
                             "rules": rules or []}},
        "clients": [
            {"name": "agent", "key_sha256": auth.hash_key(CLIENT_KEY), "may_pin": True},
            {"name": "other", "key_sha256": auth.hash_key(OTHER_KEY)},
            *(extra_clients or []),
        ],
    }
    if len(backends) > 1:
        doc["routes"]["coder"]["fallback"] = list(backends)[-1]
    for name, url in (embed or {}).items():
        doc["backends"][name] = {"url": url, "task": "embed", "served_model_name": name}
        doc["routes"][name] = {"models": [name], "task": "embed", "variants": [name]}
    return doc


class GatewayServer:
    """`with GatewayServer(policy_dict) as gw:` gives `gw.url` (https .../v1), `gw.admin`."""

    def __init__(self, policy: dict[str, Any] | None = None, *, certs: CertFiles | None = None,
                 args: tuple[str, ...] = (), insecure: bool = False,
                 policy_path: Path | None = None, operator: dict[str, Any] | None = None
                 ) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="specrouter-gw-")
        self.dir = Path(self._tmp.name)
        self.certs = certs or make_local_ca(self.dir / "tls")
        self.policy_path = policy_path or self.dir / "policy.yaml"
        if policy is not None:
            self.write_policy(policy)
        # The operator file (actions, secrets, engine hosts), written owner-only as production
        # requires; without one the gateway allows no actions, no secrets, loopback engines.
        self.operator_path: Path | None = None
        if operator is not None:
            self.operator_path = self.dir / "operator.yaml"
            self.operator_path.write_text(yaml.safe_dump(operator, sort_keys=False))
            self.operator_path.chmod(0o600)
        self.args = args
        self.insecure = insecure
        self.proc: subprocess.Popen[str] | None = None
        self.base = self.admin = ""
        self.output: list[str] = []

    def write_policy(self, policy: dict[str, Any]) -> None:
        self.policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def __enter__(self) -> GatewayServer:
        cmd = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(self.policy_path),
               "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
               "--admin-token", ADMIN_TOKEN, "--state-dir", str(self.dir / "state"),
               "--scrape-interval", "0.25", *self.args]
        if self.operator_path is not None:
            cmd += ["--operator-file", str(self.operator_path)]
        if self.insecure:
            cmd.append("--insecure-http")
        else:
            cmd += ["--tls-cert", str(self.certs.cert), "--tls-key", str(self.certs.key)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env)
        assert self.proc.stdout is not None
        timer = threading.Timer(20, self.proc.kill)
        timer.start()
        try:
            for line in self.proc.stdout:
                self.output.append(line)
                match = _LINE.search(line)
                if match:
                    self.base, self.admin = match.group(1), match.group(2)
                    break
        finally:
            timer.cancel()
        if not self.base:
            self.proc.kill()
            raise RuntimeError("gateway did not start:\n" + "".join(self.output))
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmp.cleanup()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def hup(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def client(self, key: str = CLIENT_KEY, **kw: Any) -> httpx.Client:
        verify: Any = False if self.insecure else ssl.create_default_context(cafile=str(self.certs.ca_cert))
        return httpx.Client(base_url=self.base, verify=verify,
                            headers={"authorization": f"Bearer {key}"}, timeout=30, **kw)

    def openai(self, key: str = CLIENT_KEY, **kw: Any) -> Any:
        import openai

        verify: Any = False if self.insecure else ssl.create_default_context(cafile=str(self.certs.ca_cert))
        http_client: Any = httpx.Client(verify=verify, timeout=30)
        return openai.OpenAI(base_url=self.url, api_key=key, http_client=http_client, **kw)

    def admin_get(self, path: str) -> httpx.Response:
        return httpx.get(self.admin + path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
                         timeout=10)

    def metrics(self) -> str:
        return httpx.get(self.admin + "/metrics", timeout=10).text
