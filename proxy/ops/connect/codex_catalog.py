"""A Codex model catalog entry for the gateway's model: no "Model metadata not found" warning,
and the same prompt Codex sends without it.

For a model not in its catalog Codex 0.171 warns on every turn and uses fallback metadata. A
`model_catalog_json` entry silences it, but an entry must carry `base_instructions` (or a
`model_messages.instructions_template`), which Codex then sends instead of its own. The
fallback's instructions are not in `codex debug models` (it lists the bundled models, each with
its own prompt and tool mode), so they are read from the user's own Codex: one `codex exec` for
the model against a loopback listener that records the request and refuses it. Its first
developer message is the base prompt; nothing of it is kept in this repository.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# The fields a 0.171 entry requires, at the values of Codex's own fallback metadata (the other
# fields default to the fallback's): checked by comparing the requests it sends with and
# without the entry (tests/agents/test_connect.py).
FALLBACK_FIELDS: dict[str, Any] = {
    "supported_reasoning_levels": [],
    "shell_type": "default",
    "visibility": "none",
    "supported_in_api": True,
    "priority": 99,
    "support_verbosity": False,
    "truncation_policy": {"mode": "bytes", "limit": 10_000},
    "experimental_supported_tools": [],
}
RUN_TIMEOUT_S = 30.0
MAX_BODY = 8 << 20  # a request body larger than this is not Codex's first turn
MAX_INSTRUCTIONS = 256 << 10


class CatalogError(Exception):
    """Why no entry was made (the message says it; connect then writes none)."""


def entry(slug: str, window: int | None, instructions: str) -> dict[str, Any]:
    """The model's catalog entry: the fallback's metadata, its instructions, our window."""
    made: dict[str, Any] = {"slug": slug, "display_name": slug, **FALLBACK_FIELDS}
    if window is not None:
        made["context_window"] = made["max_context_window"] = window
    made["base_instructions"] = instructions
    return made


def catalog_text(slug: str, window: int | None, instructions: str) -> str:
    return json.dumps({"models": [entry(slug, window, instructions)]}, indent=2) + "\n"


def fallback_instructions(slug: str, codex: str | None = None) -> str:
    """The base instructions the installed Codex sends for `slug` without a catalog entry."""
    binary = codex or shutil.which("codex")
    if binary is None:
        raise CatalogError("codex is not on PATH")
    return instructions_of(first_request(binary, _capture_args(slug)))


def instructions_of(body: bytes) -> str:
    """The base prompt in a Responses request Codex sent: `instructions`, else the first input
    item when it is a developer message of one text."""
    try:
        request = json.loads(body)
    except ValueError as exc:
        raise CatalogError("codex sent a request that is not JSON") from exc
    text: object = request.get("instructions") if isinstance(request, dict) else None
    if not text and isinstance(request, dict) and isinstance(request.get("input"), list):
        first = request["input"][0] if request["input"] else None
        if isinstance(first, dict) and first.get("role") == "developer":
            parts = first.get("content")
            if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], dict):
                text = parts[0].get("text")
    if not isinstance(text, str) or not text.strip() or len(text) > MAX_INSTRUCTIONS:
        raise CatalogError("codex's request holds no base instructions where 0.171 puts them")
    return text


def _capture_args(slug: str) -> Callable[[str], list[str]]:
    """Codex's arguments for `slug` on a provider of its own at the recorder's base URL."""

    def args(base_url: str) -> list[str]:
        provider = (
            f'{{name="capture", base_url="{base_url}", env_key="CAPTURE_KEY",'
            ' wire_api="responses", supports_websockets=false, request_max_retries=0,'
            " stream_max_retries=0}"
        )
        return [
            "-c",
            f"model_providers.capture={provider}",
            "-c",
            "model_provider=capture",
            "-c",
            f"model={json.dumps(slug)}",
        ]

    return args


def first_request(
    codex: str, args: Callable[[str], list[str]], env: dict[str, str] | None = None
) -> bytes:
    """The body of the first request `codex exec ARGS hi` sends to a loopback listener (its base
    URL given to `args`), which refuses it. Without `env`, in a CODEX_HOME of its own: the
    user's sessions, AGENTS.md and settings stay out of it."""
    got: list[bytes] = []
    arrived = threading.Event()

    class Recorder(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            size = int(self.headers.get("content-length") or 0)
            if 0 < size <= MAX_BODY and not got:
                got.append(self.rfile.read(size))
                arrived.set()
            refusal = b'{"error":{"message":"recorded","type":"invalid_request_error"}}'
            self.send_response(400)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(refusal)))
            self.end_headers()
            self.wfile.write(refusal)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        with tempfile.TemporaryDirectory(prefix="specrouter-codex-") as home:
            run_env = env or {**os.environ, "CODEX_HOME": home}
            command = [codex, "exec", "--skip-git-repo-check", *args(base_url), "hi"]
            try:
                subprocess.run(
                    command,
                    cwd=home,
                    # a proxy the user's environment names is not asked for the loopback
                    env={**run_env, "CAPTURE_KEY": "capture", "NO_PROXY": "127.0.0.1"},
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=RUN_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                pass  # the request may have come before
            except OSError as exc:
                raise CatalogError(f"cannot run {codex}: {exc}") from exc
    finally:
        server.shutdown()
        server.server_close()
    if not arrived.is_set():
        raise CatalogError(f"{codex} sent no request within {RUN_TIMEOUT_S:.0f} s")
    return got[0]
