"""An SGLang engine on loopback that answers with SGLang 0.5.23's own bytes
(tests/fixtures/sglang-golden/): for each request the frozen answer to the same request shape
(stream or body; spec details and continuous usage asked or not; usage or not); its /metrics the
frozen page. Every body it got is kept, to check what the gateway asked."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-golden" / "0.5.23"
ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}


def answer_name(endpoint: str, body: dict[str, Any]) -> str:
    asked = body.get("return_spec_tokens_details") is True
    if not body.get("stream"):
        return f"{endpoint}_full_{'asked' if asked else 'plain'}.json"
    opts = body.get("stream_options") or {}
    if asked and opts.get("continuous_usage_stats"):
        return f"{endpoint}_stream_asked.sse"
    return f"{endpoint}_stream_{'usage' if opts.get('include_usage') else 'plain'}.sse"


class SglangPlayback:
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send((GOLDEN / "metrics.prom").read_bytes(), "text/plain")
                else:
                    self._send(b"", "text/plain")  # /health: SGLang's is an empty 200

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                engine.bodies.append(body)
                name = answer_name(ENDPOINTS[self.path], body)
                kind = "text/event-stream" if name.endswith(".sse") else "application/json"
                self._send((GOLDEN / name).read_bytes(), kind)

            def _send(self, data: bytes, kind: str) -> None:
                self.send_response(200)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SglangPlayback:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
