"""Which gateway an agent is connected to: base URL, CA file, client key and model.

Each comes from a flag, else the variable README's Clients section exports (`SPECROUTER_URL`,
`SPECROUTER_CA`, `SPECROUTER_KEY`), else the demo's state directory (`specrouter demo` records its
base URL and model in `connect.json` there, beside `tls/ca.pem` and `client.key`). A CA file
given for another URL is never mixed with the demo's.
"""

from __future__ import annotations

import json
import math
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx

DEMO_URL = "https://127.0.0.1:8443/v1"
ENDPOINT_FILE = "connect.json"  # written by `specrouter demo` into its state directory


class ConnectError(Exception):
    """Something the user must fix before an agent can use the gateway (the message says what)."""


# Kept below the window by Codex's compaction limit: the next turn's tool results and answer.
COMPACT_MARGIN = 0.1
# An agent's own timeout fires this long after the gateway's first-token limit: the agent then
# reads the gateway's error, not a timeout of its own.
TIMEOUT_MARGIN_S = 30.0


@dataclass(frozen=True)
class Gateway:
    url: str  # the OpenAI base URL, ending in /v1
    ca: Path | None  # None: the gateway's certificate is publicly trusted
    key: str
    model: str
    # From the gateway's /v1/models (proxy/relay/models_list.py); None with --no-check or an
    # older gateway: the agents' own defaults then stand.
    window: int | None = None
    first_token_limit_s: float | None = None

    @property
    def root(self) -> str:
        """The Anthropic base URL: the same host, without /v1."""
        return self.url.removesuffix("/v1")

    @property
    def compact_limit(self) -> int | None:
        return None if self.window is None else int(self.window * (1 - COMPACT_MARGIN))

    def timeout_ms(self, default_ms: int) -> int | None:
        """An agent's timeout above the first-token limit, never below its own default."""
        if self.first_token_limit_s is None:
            return None
        return max(default_ms, math.ceil((self.first_token_limit_s + TIMEOUT_MARGIN_S) * 1000))


def record_demo_endpoint(state: Path, url: str, model: str) -> None:
    """What `specrouter demo` leaves for `specrouter connect` (its base URL is not a default)."""
    (state / ENDPOINT_FILE).write_text(json.dumps({"base_url": url, "model": model}) + "\n")


def resolve(
    *,
    url: str | None,
    ca: Path | None,
    key: str | None,
    model: str | None,
    state: Path,
) -> tuple[str, Path | None, str, str | None]:
    """URL, CA, key and (if known without asking the gateway) model, before any check."""
    url = url or os.environ.get("SPECROUTER_URL")
    ca = ca or _env_path("SPECROUTER_CA")
    key = key or os.environ.get("SPECROUTER_KEY")
    demo: dict[str, str] = {}
    if (state / ENDPOINT_FILE).exists():
        demo = json.loads((state / ENDPOINT_FILE).read_text())
    if url is None:  # the demo's (running or not): its CA and key belong to it
        url = demo.get("base_url", DEMO_URL)
        model = model or demo.get("model")
        if ca is None and (state / "tls" / "ca.pem").exists():
            ca = (state / "tls" / "ca.pem").resolve()
        if key is None and (state / "client.key").exists():
            key = (state / "client.key").read_text().strip()
    if key is None:
        raise ConnectError(
            "no client key: give --key, export SPECROUTER_KEY, or start `specrouter demo` "
            f"(its key is {state / 'client.key'})"
        )
    if ca is not None and not ca.is_file():
        raise ConnectError(f"CA file {ca} does not exist")
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return url, ca.resolve() if ca else None, key, model


def check(url: str, ca: Path | None, key: str, model: str | None) -> Gateway:
    """One GET /models with this CA and key: the errors an agent would hide, said plainly.

    (A CA that does not verify the gateway makes Codex retry "Reconnecting..." with no hint.)
    The model is the one asked for, else the first the gateway serves.
    """
    verify: ssl.SSLContext | bool = True
    if ca is not None:
        verify = ssl.create_default_context(cafile=str(ca))
    try:
        answer = httpx.get(
            f"{url}/models", headers={"authorization": f"Bearer {key}"}, verify=verify, timeout=10
        )
    except httpx.ConnectError as exc:
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            where = f"the CA file {ca}" if ca else "the system's CAs (give --ca)"
            raise ConnectError(f"{url}: its certificate is not verified by {where}") from exc
        raise ConnectError(f"{url}: cannot connect ({exc}); is the gateway running?") from exc
    except httpx.HTTPError as exc:
        raise ConnectError(f"{url}: {exc}") from exc
    if answer.status_code == 401:
        raise ConnectError(f"{url}: the gateway refused this client key (401)")
    if answer.status_code != 200:
        raise ConnectError(f"{url}/models answered {answer.status_code}: {answer.text[:200]}")
    listed = answer.json()
    windows = {str(m["id"]): m.get("max_model_len") for m in listed.get("data", [])}
    served = list(windows)
    if model is None:
        if not served:
            raise ConnectError(f"{url} serves no model")
        model = served[0]
    elif model not in served:
        raise ConnectError(f"{url} does not serve {model!r} (it serves {', '.join(served)})")
    window, limit = windows[model], listed.get("first_token_limit_s")
    return Gateway(
        url,
        ca,
        key,
        model,
        window if isinstance(window, int) and window > 0 else None,
        float(limit) if isinstance(limit, int | float) and limit > 0 else None,
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
