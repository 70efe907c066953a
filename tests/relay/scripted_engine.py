"""A scripted llama.cpp-shaped engine on loopback: a chat stream of given pieces, then death or
a normal end. Real engines (llama.cpp, vLLM, the simulator) hold back text that may begin a stop
string, so none of them sends the beginning of a stop that the next engine would complete: this
one does, which is what a stop straddling a continuation splice needs."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedEngine:
    """`pieces` streamed `gap_s` apart; `die` closes the connection mid-stream after them."""

    def __init__(self, pieces: list[str], *, die: bool = False, gap_s: float = 0.0) -> None:
        self.script(pieces, die=die, gap_s=gap_s)
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._plain(b'{"status":"ok"}' if self.path == "/health" else b"")

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                engine.bodies.append(body)
                engine.stream(self, body)

            def _plain(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def script(self, pieces: list[str], *, die: bool = False, gap_s: float = 0.0) -> None:
        """What the next requests get, with what was recorded forgotten (call it between
        streams: one still running would write into the new record)."""
        self.pieces, self.die, self.gap_s = pieces, die, gap_s
        self.bodies: list[dict[str, Any]] = []
        self.sent = 0  # pieces written before the gateway went away (or all)
        self.aborted = threading.Event()  # the gateway closed the stream before its end
        self.finished = threading.Event()

    def __enter__(self) -> ScriptedEngine:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def stream(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("transfer-encoding", "chunked")
        h.end_headers()
        head = {"created": 1, "id": f"chatcmpl-{len(self.bodies)}", "model": body["model"]}

        def frame(choices: list[Any], **extra: Any) -> bytes:
            obj = {"choices": choices, **head, "object": "chat.completion.chunk", **extra}
            return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

        def chunk(data: bytes) -> None:
            h.wfile.write(b"%x\r\n%b\r\n" % (len(data), data))
            h.wfile.flush()

        def choice(delta: dict[str, Any], finish: str | None = None) -> list[Any]:
            return [{"finish_reason": finish, "index": 0, "delta": delta}]

        try:
            chunk(frame(choice({"role": "assistant", "content": None})))
            for piece in self.pieces:
                time.sleep(self.gap_s)
                chunk(frame(choice({"content": piece})))
                self.sent += 1
            if self.die:
                h.close_connection = True
                h.connection.close()
                return
            chunk(frame(choice({}, "length")))
            n = len(self.pieces)
            usage = {"completion_tokens": n, "prompt_tokens": 5, "total_tokens": n + 5}
            chunk(frame([], usage=usage))
            chunk(b"data: [DONE]\n\n")
            h.wfile.write(b"0\r\n\r\n")
            self.finished.set()
        except OSError:
            self.aborted.set()
