"""Which gateway an agent is connected to: base URL, CA file, client key and model.

Each comes from a flag, else the variable docs/clients.md's first recipe exports (`SPECROUTER_URL`,
`SPECROUTER_CA`, `SPECROUTER_KEY`), else the demo's state directory (`specrouter demo` records its
base URL and model in `connect.json` there, beside `tls/ca.pem` and `client.key`). A CA file
given for another URL is never mixed with the demo's.

What the gateway answers is bounded: the whole check within `timeout_s` (a gateway dripping its
answer is cut off), its body within MAX_MODELS_BYTES; its model ids go into files and commands
only when they hold no control character (proxy/ops/connect/quoting.py). A `--ca` must be a PEM
certificate: only its certificates are read, never a key.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

import httpx

from proxy.ops.connect.quoting import UnsafeValue, plain, shown

DEMO_URL = "https://127.0.0.1:8443/v1"
ENDPOINT_FILE = "connect.json"  # written by `specrouter demo` into its state directory
CHECK_TIMEOUT_S = 10.0  # the whole GET /models: connect, headers and body
MAX_MODELS_BYTES = 4 << 20  # a /models list of thousands of models is well under 1 MiB
MAX_CA_BYTES = 1 << 20  # a CA file of hundreds of certificates
_PEM_CERT = re.compile(
    r"-----BEGIN CERTIFICATE-----\r?\n[A-Za-z0-9+/=\r\n]+-----END CERTIFICATE-----"
)


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

    def __post_init__(self) -> None:
        plain("the URL", self.url)
        plain("the client key", self.key)
        plain("the model", self.model)
        if self.ca is not None:
            plain("the CA file's name", str(self.ca))

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
    if ca is not None:
        ca_certificates(ca)  # a clear refusal now, not a traceback or a key copied later
    plain("the URL", url)  # before any message prints it
    url = url.rstrip("/")
    if not url.endswith("/v1"):
        url += "/v1"
    return url, ca.resolve() if ca else None, key, model


def ca_certificates(ca: Path) -> str:
    """The PEM certificates of the CA file `ca`, each on its own lines; refused (ConnectError)
    when the file holds a private key or no certificate OpenSSL accepts."""
    try:
        with ca.open("rb") as f:
            raw = f.read(MAX_CA_BYTES + 1)
    except OSError as exc:
        raise ConnectError(f"CA file {shown(str(ca))}: {exc.strerror or exc}") from exc
    text = raw.decode("ascii", "replace")
    if "PRIVATE KEY-----" in text:
        raise ConnectError(
            f"--ca {shown(str(ca))} holds a private key: give the CA's certificate (ca.pem)"
        )
    if len(raw) > MAX_CA_BYTES:
        raise ConnectError(f"--ca {shown(str(ca))} is over {MAX_CA_BYTES} bytes: not a CA file")
    blocks = _PEM_CERT.findall(text)
    try:
        if not blocks:
            raise ssl.SSLError("no PEM certificate")
        ssl.create_default_context(cadata="\n".join(blocks))
    except ssl.SSLError as exc:
        raise ConnectError(
            f"--ca {shown(str(ca))} is not a PEM certificate ({shown(str(exc))})"
        ) from exc
    return "".join(b.replace("\r\n", "\n") + "\n" for b in blocks)


def check(
    url: str, ca: Path | None, key: str, model: str | None, timeout_s: float = CHECK_TIMEOUT_S
) -> Gateway:
    """One GET /models with this CA and key: the errors an agent would hide, said plainly.

    (A CA that does not verify the gateway makes Codex retry "Reconnecting..." with no hint.)
    The model is the one asked for, else the first the gateway serves.
    """
    status, body = _get_models(url, ca, key, timeout_s)
    if status == 401:
        raise ConnectError(f"{url}: the gateway refused this client key (401)")
    if status != 200:
        text = body.decode("utf-8", "replace")
        raise ConnectError(f"{url}/models answered {status}: {shown(text)}")
    try:
        listed = json.loads(body)
        data = listed.get("data", [])
        served = [m["id"] for m in data]
        windows = {m["id"]: m.get("max_model_len") for m in data}
        limit = listed.get("first_token_limit_s")
    except (ValueError, AttributeError, TypeError, KeyError) as exc:
        raise ConnectError(f"{url}/models: not a model list ({shown(str(exc))})") from exc
    if not all(isinstance(m, str) for m in served):
        raise ConnectError(f"{url}/models: a model id that is not a string")
    if model is None:
        if not served:
            raise ConnectError(f"{url} serves no model")
        model = served[0]
    elif model not in served:
        names = shown(", ".join(served))
        raise ConnectError(f"{url} does not serve {shown(repr(model))} (it serves {names})")
    try:
        plain("the gateway's model id", model)
    except UnsafeValue as exc:
        raise ConnectError(str(exc)) from exc
    window = windows[model]
    return Gateway(
        url,
        ca,
        key,
        model,
        window if type(window) is int and 0 < window < 2**31 else None,
        float(limit) if type(limit) in (int, float) and 0 < limit < 86_400 else None,
    )


def _get_models(url: str, ca: Path | None, key: str, timeout_s: float) -> tuple[int, bytes]:
    """GET /models: (status, body), the whole exchange within `timeout_s` and the body within
    MAX_MODELS_BYTES (httpx's timeouts are per read: a gateway sending a byte a second would
    never hit them, so the deadline is the event loop's, over headers and body alike)."""
    verify: ssl.SSLContext | bool = True
    if ca is not None:
        verify = ssl.create_default_context(cadata=ca_certificates(ca))
    try:
        return asyncio.run(_fetch(f"{url}/models", verify, key, timeout_s))
    except TimeoutError as exc:
        raise ConnectError(f"{url}/models: no whole answer within {timeout_s:g} s") from exc
    except httpx.ConnectError as exc:
        if "CERTIFICATE_VERIFY_FAILED" in str(exc):
            where = f"the CA file {ca}" if ca else "the system's CAs (give --ca)"
            raise ConnectError(f"{url}: its certificate is not verified by {where}") from exc
        raise ConnectError(f"{url}: cannot connect ({exc}); is the gateway running?") from exc
    except httpx.HTTPError as exc:
        raise ConnectError(f"{url}: {shown(str(exc))}") from exc


async def _fetch(
    url: str, verify: ssl.SSLContext | bool, key: str, timeout_s: float
) -> tuple[int, bytes]:
    headers = {"authorization": f"Bearer {key}"}
    async with (
        asyncio.timeout(timeout_s),
        httpx.AsyncClient(verify=verify, timeout=timeout_s) as client,
        client.stream("GET", url, headers=headers) as answer,
    ):
        body = bytearray()
        async for chunk in answer.aiter_bytes():
            body += chunk
            if len(body) > MAX_MODELS_BYTES:
                raise ConnectError(f"{url}: over {MAX_MODELS_BYTES} bytes, refused")
        return answer.status_code, bytes(body)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None
