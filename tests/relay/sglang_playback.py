"""An SGLang engine on loopback that answers with SGLang 0.5.23's own bytes
(tests/fixtures/sglang-golden/): for each request the frozen answer to the same request shape
(chat, completions, Anthropic Messages, Responses; stream or body; spec details and continuous
usage asked or not; usage or not); its /metrics the
frozen page. Every body it got is kept, to check what the gateway asked.

Three more behaviours for the resilience tests: `fail=True` answers every request as SGLang's
serving code answers one that raised (its `create_error_response`: a 500 with its error body);
`dies_after=N` sends a stream's first N frames and drops the connection (an engine that died);
a stream asking more than the frozen answer's `max_tokens` gets that answer's opening frames,
then its first content frame again and again until the gateway closes the connection (SGLang
aborts a request whose HTTP connection closed: its `create_abort_task` and the tokenizer
manager's `is_disconnected` check), which sets `aborted`."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from policies.capabilities import SGLANG_HEALTH_POLL_S

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-golden" / "0.5.23"
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
}
FROZEN_MAX_TOKENS = 16  # what the fixtures' requests asked
# SGLang's `create_error_response(..., err_type="InternalServerError", status_code=500)`, as its
# ORJSONResponse writes it.
ERROR_500 = (
    b'{"object":"error","message":"Internal server error: engine failed",'
    b'"type":"InternalServerError","param":null,"code":500}'
)


def answer_name(endpoint: str, body: dict[str, Any]) -> str:
    if endpoint in ("messages", "responses"):  # neither has a field for the spec figures
        return f"{endpoint}_stream.sse" if body.get("stream") else f"{endpoint}_full.json"
    asked = body.get("return_spec_tokens_details") is True
    if not body.get("stream"):
        return f"{endpoint}_full_{'asked' if asked else 'plain'}.json"
    opts = body.get("stream_options") or {}
    if asked and opts.get("continuous_usage_stats"):
        return f"{endpoint}_stream_asked.sse"
    return f"{endpoint}_stream_{'usage' if opts.get('include_usage') else 'plain'}.sse"


def endless(endpoint: str) -> tuple[bytes, bytes]:
    """The frozen stream's frames up to its first content frame, and that frame (repeated)."""
    frames = [
        f + b"\n\n"
        for f in (GOLDEN / f"{endpoint}_stream_plain.sse").read_bytes().split(b"\n\n")
        if f
    ]
    first = 1 if endpoint == "chat" else 0  # chat opens with a role frame
    return b"".join(frames[:first]), frames[first]


class SglangPlayback:
    def __init__(self, *, fail: bool = False, dies_after: int | None = None) -> None:
        self.fail = fail
        self.dies_after = dies_after
        self.bodies: list[dict[str, Any]] = []
        self.aborted = threading.Event()  # an endless stream's connection was closed
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send((GOLDEN / "metrics.prom").read_bytes(), "text/plain")
                else:  # /health: SGLang's is an empty 200 after its one-token poll (1.01-1.07 s
                    time.sleep(SGLANG_HEALTH_POLL_S + 0.05)  # on a real one on this CPU)
                    self._send(b"", "text/plain")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                engine.bodies.append(body)
                if engine.fail:
                    self._send(ERROR_500, "application/json", 500)
                    return
                if body.get("stream") and body.get("max_tokens", 0) > FROZEN_MAX_TOKENS:
                    self._endless(ENDPOINTS[self.path])
                    return
                name = answer_name(ENDPOINTS[self.path], body)
                kind = "text/event-stream" if name.endswith(".sse") else "application/json"
                if engine.dies_after is not None and body.get("stream"):
                    self._dies((GOLDEN / name).read_bytes(), engine.dies_after)
                    return
                self._send((GOLDEN / name).read_bytes(), kind)

            def _dies(self, data: bytes, frames: int) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for frame in [f + b"\n\n" for f in data.split(b"\n\n") if f][:frames]:
                    self.wfile.write(b"%x\r\n%b\r\n" % (len(frame), frame))
                self.wfile.flush()
                self.close_connection = True  # no last chunk: the stream broke

            def _endless(self, endpoint: str) -> None:
                head, frame = endless(endpoint)
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for data in (head, *[frame] * 100_000):
                        if data:
                            self.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
                            self.wfile.flush()
                        time.sleep(0.005)  # a decode step
                except OSError:
                    engine.aborted.set()
                self.close_connection = True

            def _send(self, data: bytes, kind: str, status: int = 200) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True  # closing does not wait for a health check's poll
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(
            target=self.server.serve_forever, args=(0.05,), daemon=True
        )  # a short poll: shutdown waits one

    def __enter__(self) -> SglangPlayback:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
