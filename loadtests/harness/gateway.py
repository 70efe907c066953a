"""Run the real gateway (`specrouter serve`) as a subprocess on loopback, with real TLS."""

from __future__ import annotations

import signal
import ssl
import tempfile
from pathlib import Path
from typing import Any

import httpx
import yaml

from loadtests.harness.forked import Process
from loadtests.harness.launch import SERVE_READY, Child, cli, serve_args
from proxy import auth
from proxy.certs import CertFiles, make_local_ca

CLIENT_KEY = "sk-test-client"
OTHER_KEY = "sk-test-other"
# The gateway refuses an admin token under 32 characters.
ADMIN_TOKEN = "admin-test-token-of-thirty-two-chars"


def coder_policy(
    backends: dict[str, str],
    *,
    served: str = "qwen3.8-27b",
    rules: list[dict[str, Any]] | None = None,
    embed: dict[str, str] | None = None,
    defaults: dict[str, Any] | None = None,
    extra_clients: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A policy: one coding route over `backends` (name -> URL, the first is the default)."""
    doc: dict[str, Any] = {
        "schema": 1,
        "backends": {
            name: {
                "url": url,
                "kind": "vllm",
                "task": "generate",
                "served_model_name": served,
                "max_concurrency": 16,
            }
            for name, url in backends.items()
        },
        "routes": {
            "coder": {
                "models": ["coder", served],
                "task": "generate",
                "variants": list(backends),
                "defaults": {"temperature": 0.7} if defaults is None else defaults,
                "rules": rules or [],
            }
        },
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

    def __init__(
        self,
        policy: dict[str, Any] | None = None,
        *,
        certs: CertFiles | None = None,
        args: tuple[str, ...] = (),
        insecure: bool = False,
        policy_path: Path | None = None,
        operator: dict[str, Any] | None = None,
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
        self.proc: Process | None = None
        self.base = self.admin = ""
        self.output: list[str] = []
        self._child: Child | None = None

    def write_policy(self, policy: dict[str, Any]) -> None:
        self.policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))

    @property
    def url(self) -> str:
        return self.base + "/v1"

    def __enter__(self) -> GatewayServer:
        args = serve_args(
            self.policy_path,
            self.dir / "state",
            ADMIN_TOKEN,
            certs=None if self.insecure else self.certs,
            scrape_interval_s=0.25,
            extra=(
                *self.args,
                *(
                    ()
                    if self.operator_path is None
                    else ("--operator-file", str(self.operator_path))
                ),
            ),
        )
        # keep=None: every line, for the tests that read the logs
        child = Child("gateway", cli("serve", *args), ready=SERVE_READY, keep=None)
        self._child = child
        self.output = child.output
        # A start takes ~1 s alone; a loaded suite's second lane (nice 10, engines booting
        # beside it) once took over 20 s. A gateway that exits fails at once whatever this is.
        child.start(timeout=60)
        assert child.match is not None
        self.proc = child.proc
        self.base, self.admin = child.match.group(1), child.match.group(2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._child is not None:
            self._child.stop(timeout=10)
        self._tmp.cleanup()

    def kill(self) -> None:
        assert self._child is not None and self._child.proc is not None
        self._child.kill()

    def hup(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGHUP)

    def client(self, key: str = CLIENT_KEY, **kw: Any) -> httpx.Client:
        verify: Any = (
            False if self.insecure else ssl.create_default_context(cafile=str(self.certs.ca_cert))
        )
        return httpx.Client(
            base_url=self.base,
            verify=verify,
            headers={"authorization": f"Bearer {key}"},
            timeout=30,
            **kw,
        )

    def openai(self, key: str = CLIENT_KEY, **kw: Any) -> Any:
        import openai

        verify: Any = (
            False if self.insecure else ssl.create_default_context(cafile=str(self.certs.ca_cert))
        )
        http_client: Any = httpx.Client(verify=verify, timeout=30)
        return openai.OpenAI(base_url=self.url, api_key=key, http_client=http_client, **kw)

    def admin_get(self, path: str) -> httpx.Response:
        return httpx.get(
            self.admin + path, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        )

    def metrics(self) -> str:
        return httpx.get(self.admin + "/metrics", timeout=10).text
