"""A minimal vLLM-shaped SSE backend for benchmarks: `python -m loadtests.bench.pacer`.

It streams `/v1/chat/completions` chunks at a fixed step, with the exact chunk shapes of vLLM's
OpenAI server (shared/reference/vllm-wire-format.md §1.1-1.5): the role chunk with the first
token's chunk right behind it (one engine step), one content chunk per step, the last one carrying
`finish_reason: "length"`, then the usage chunk when `stream_options.include_usage` asks for it,
and `data: [DONE]`. `continuous_usage_stats` puts a `usage` object on every chunk, as vLLM does.
Each event is one HTTP chunk, as uvicorn writes them.

It is built to cost next to nothing, so that a benchmark measures what sits in front of it: a
raw asyncio protocol (uvloop when installed), httptools for the request line and headers, and
chunk bytes assembled from prebuilt pieces (one `%` format per chunk for the usage counts). No
framework, no JSON encoder on the per-chunk path.

Knobs (flags, per request overridable through vLLM's own `vllm_xargs` field, which any
gateway passes through untouched):
- `--step-ms` / `pacer_step_ms`: time between two engine steps; 0 = as fast as the connection
  drains: one step per stream per event-loop turn, each its own write as vLLM does, until the
  socket pushes back (pause_writing).
- `--burst` / `pacer_burst`: unpaced only, steps written together per loop turn (default 1;
  more makes the pacer cheaper and the proxy's reads bigger).
- `--tokens-per-chunk` / `pacer_tokens_per_chunk`: tokens per decode chunk (speculative decoding
  accepts several per step); the first chunk carries the prefill's single token.
- `--max-tokens`: tokens per response when the request sets no `max_tokens`.
- `--ttft-ms` / `pacer_ttft_ms`: prefill time before the first chunk (default 0).

Also `GET /health` (200, empty body, like vLLM), `GET /metrics` (a few counters in Prometheus
text), `GET /v1/models`, and non-streaming chat completions. A request's `x-request-id` is
echoed in the answer's head, as vLLM does with `--enable-request-id-headers` (the deploy's flag;
`--no-request-id-echo`: as vLLM without it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any, cast

import httptools
import orjson

from loadtests.bench.pacer_frames import (
    CHUNK_END,
    FINGERPRINT_TAIL,
    SSE_HEAD,
    USAGE,
    chunk_base,
    completion_body,
    content_piece,
    error_body,
    http_chunk,
    last_piece,
    models_body,
    prompt_tokens,
    role_piece,
)
from proxy.vllm_wire import DONE

# The streaming POST paths and each one's last event: chat's chunks on all three (the overhead
# benchmark's Responses and Messages rounds measure the relay, not the event shapes), ended as
# each API ends a stream.
_STREAM_ENDS = {
    b"/v1/chat/completions": DONE,
    b"/v1/responses": b'event: response.completed\ndata: {"type":"response.completed"}\n\n',
    b"/v1/messages": b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
}


@dataclass(slots=True)
class PacerConfig:
    step_ms: float = 30.0
    tokens_per_chunk: int = 1
    max_tokens: int = 64
    ttft_ms: float = 0.0
    burst: int = 1
    model: str = "pacer"
    echo_request_id: bool = True  # as vLLM with --enable-request-id-headers


@dataclass(slots=True)
class PacerStats:
    requests: int = 0
    streams_done: int = 0
    streams_aborted: int = 0
    chunks: int = 0
    open_streams: int = 0
    connections: int = 0


class ChatStream:
    """One streaming response: precomputed frame pieces and the step schedule."""

    __slots__ = (
        "proto",
        "head",
        "role",
        "content",
        "first_content",
        "usage",
        "continuous",
        "include_usage",
        "prompt",
        "max_tokens",
        "tpc",
        "step",
        "burst",
        "sent",
        "index",
        "t0",
        "handle",
        "tail",
        "done",
        "end",
    )

    def __init__(
        self,
        proto: PacerProtocol,
        body: dict[str, Any],
        request_id: str,
        cfg: PacerConfig,
        end: bytes = DONE,
    ) -> None:
        self.proto = proto
        self.end = end
        xargs = body.get("vllm_xargs")
        xargs = xargs if isinstance(xargs, dict) else {}
        opts = body.get("stream_options")
        opts = opts if isinstance(opts, dict) else {}
        self.include_usage = opts.get("include_usage") is True
        self.continuous = self.include_usage and opts.get("continuous_usage_stats") is True
        max_tokens = body.get(
            "max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens"))
        )
        self.max_tokens = (
            max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else cfg.max_tokens
        )
        tpc = xargs.get("pacer_tokens_per_chunk", cfg.tokens_per_chunk)
        self.tpc = max(1, int(tpc))
        self.step = max(0.0, float(xargs.get("pacer_step_ms", cfg.step_ms))) / 1000.0
        self.burst = max(1, int(xargs.get("pacer_burst", cfg.burst)))
        self.prompt = prompt_tokens(body)
        model = body.get("model") if isinstance(body.get("model"), str) else cfg.model
        base = chunk_base(request_id, int(time.time()), model)
        self.usage = base + b',"choices":[]'  # the final usage chunk's start
        self.head = base + b',"choices":[{"index":0,"delta":'
        self.role = role_piece(self.head)
        self.first_content = content_piece(self.head, 1)
        self.content = content_piece(self.head, self.tpc)
        self.sent = 0  # completion tokens sent so far
        self.index = 0  # engine steps done
        self.t0 = 0.0
        self.handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self.tail = b""
        self.done = False

    def _usage(self) -> bytes:
        return USAGE % (self.prompt, self.prompt + self.sent, self.sent)

    def start(self, loop: asyncio.AbstractEventLoop, ttft: float) -> None:
        self.t0 = loop.time() + ttft
        if ttft > 0:
            self.handle = loop.call_at(self.t0, self.tick)
        else:
            self.tick()

    def _content_chunk(self, tokens: int, last: bool) -> bytes:
        piece = self.first_content if tokens == 1 and self.tpc != 1 else self.content
        if tokens not in (1, self.tpc):
            piece = content_piece(self.head, tokens)
        if last:
            piece = last_piece(piece)
        self.sent += tokens
        if self.continuous:
            piece += self._usage()
        if last and not self.include_usage:
            piece += FINGERPRINT_TAIL
        return http_chunk(piece + b"}\n\n")

    def _step(self) -> bytes:
        """The bytes of one engine step (the last one ends the response)."""
        out: list[bytes] = []
        if self.index == 0:
            role = (
                self.role
                + (self._usage() if self.continuous else b"")
                + b',"prompt_token_ids":null,"prompt_text":null}\n\n'
            )
            out.append(http_chunk(role))
            tokens = 1
        else:
            tokens = min(self.tpc, self.max_tokens - self.sent)
        last = self.sent + tokens >= self.max_tokens
        out.append(self._content_chunk(tokens, last))
        self.index += 1
        stats = self.proto.stats
        stats.chunks += len(out)
        if last:
            if self.include_usage:
                out.append(http_chunk(self.usage + self._usage() + FINGERPRINT_TAIL + b"}\n\n"))
            out.append(http_chunk(self.end))
            out.append(CHUNK_END)
            self.done = True
            stats.streams_done += 1
            stats.open_streams -= 1
            self.proto.stream = None
        return out[0] if len(out) == 1 else b"".join(out)

    def tick(self) -> None:
        """One engine step (paced), or a burst of steps (unpaced); then schedule the next."""
        self.handle = None
        proto = self.proto
        if self.done or proto.transport is None:
            return
        if proto.paused:  # the reader is behind: resume_writing() calls us again
            proto.waiting = self
            return
        loop = proto.loop
        if self.step > 0:
            proto.transport.write(self._step())
            if not self.done:
                self.handle = loop.call_at(self.t0 + self.index * self.step, self.tick)
            return
        # As fast as possible: `burst` steps per loop turn in one write (1, like vLLM, which
        # writes every step of every stream on its own), until the socket pushes back.
        burst = [self._step()]
        while not self.done and len(burst) < self.burst:
            burst.append(self._step())
        proto.transport.write(burst[0] if len(burst) == 1 else b"".join(burst))
        if not self.done:
            self.handle = loop.call_soon(self.tick)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if not self.done:
            self.done = True
            self.proto.stats.streams_aborted += 1
            self.proto.stats.open_streams -= 1


class PacerProtocol(asyncio.Protocol):
    """One HTTP/1.1 keep-alive connection; one request at a time (clients do not pipeline)."""

    def __init__(self, cfg: PacerConfig, stats: PacerStats) -> None:
        self.cfg = cfg
        self.stats = stats
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body: list[bytes] = []
        self.stream: ChatStream | None = None
        self.paused = False
        self.waiting: ChatStream | None = None

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.stats.connections += 1
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.connections -= 1
        if self.stream is not None:
            self.stream.cancel()
            self.stream = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._reply(400, b'{"error":"bad request"}', close=True)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        waiting, self.waiting = self.waiting, None
        if waiting is not None:
            waiting.tick()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = {}
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        path = self.url.split(b"?", 1)[0]
        self.stats.requests += 1
        if path in _STREAM_ENDS and method == b"POST":
            self._chat(b"".join(self.body), _STREAM_ENDS[path])
        elif path == b"/health" and method == b"GET":
            self._reply(200, b"", content_type=None)
        elif path == b"/metrics" and method == b"GET":
            s = self.stats
            text = (
                f"pacer_requests_total {s.requests}\npacer_chunks_total {s.chunks}\n"
                f"pacer_streams_done_total {s.streams_done}\n"
                f"pacer_streams_aborted_total {s.streams_aborted}\n"
                f"pacer_open_streams {s.open_streams}\n"
            )
            self._reply(200, text.encode(), content_type=b"text/plain; version=0.0.4")
        elif path == b"/v1/models" and method == b"GET":
            self._reply(200, models_body(self.cfg.model))
        else:
            self._reply(
                404, error_body(f"Not Found: {path.decode('latin-1')}", "NotFoundError", 404)
            )

    def _reply(
        self,
        status: int,
        body: bytes,
        *,
        content_type: bytes | None = b"application/json",
        close: bool = False,
    ) -> None:
        if self.transport is None:
            return
        reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
        head = b"HTTP/1.1 %d %s\r\n" % (status, reason)
        if content_type is not None:
            head += b"content-type: " + content_type + b"\r\n"
        head += b"content-length: %d\r\n" % len(body) + self._echo()
        if close:
            head += b"connection: close\r\n"
        self.transport.write(head + b"\r\n" + body)
        if close:
            self.transport.close()

    def _echo(self) -> bytes:
        """The request's `x-request-id` header line, echoed as vLLM does with
        `--enable-request-id-headers` (the shipped deploy's flag): the gateway reuses an engine
        connection only after an answer that echoed it (proxy/relay/engine_conn.py)."""
        rid = self.headers.get(b"x-request-id") if self.cfg.echo_request_id else None
        return b"" if rid is None else b"x-request-id: " + rid + b"\r\n"

    def _chat(self, raw: bytes, end: bytes = DONE) -> None:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            self._reply(400, error_body("body must be a JSON object", "BadRequestError", 400))
            return
        request_id = (
            self.headers.get(b"x-request-id", b"").decode("latin-1")
            or f"{id(self):x}{self.stats.requests:08x}"[-16:]
        )
        if body.get("stream") is not True:
            self._complete(body, request_id)
            return
        stream = ChatStream(self, body, request_id, self.cfg, end)
        self.stream = stream
        self.stats.open_streams += 1
        assert self.transport is not None
        self.transport.write(SSE_HEAD[:-2] + self._echo() + b"\r\n")
        xargs = body.get("vllm_xargs")
        ttft = self.cfg.ttft_ms
        if isinstance(xargs, dict) and isinstance(xargs.get("pacer_ttft_ms"), int | float):
            ttft = float(xargs["pacer_ttft_ms"])
        stream.start(self.loop, ttft / 1000.0)

    def _complete(self, body: dict[str, Any], request_id: str) -> None:
        max_tokens = body.get("max_tokens")
        n = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else self.cfg.max_tokens
        model = body.get("model") if isinstance(body.get("model"), str) else self.cfg.model
        self._reply(200, completion_body(request_id, model, n, prompt_tokens(body)))


async def serve(
    cfg: PacerConfig, host: str = "127.0.0.1", port: int = 0
) -> tuple[asyncio.Server, int, PacerStats]:
    """Start the pacer on the running loop; returns the server, its port and its counters."""
    stats = PacerStats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: PacerProtocol(cfg, stats), host, port, backlog=4096, reuse_address=True
    )
    bound = server.sockets[0].getsockname()[1]
    return server, int(bound), stats


async def _main(cfg: PacerConfig, host: str, port: int) -> None:
    server, bound, _ = await serve(cfg, host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"pacer listening on http://{shown}:{bound}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.bench.pacer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    p.add_argument(
        "--step-ms",
        type=float,
        default=30.0,
        help="time between engine steps; 0 = as fast as the connection drains",
    )
    p.add_argument("--tokens-per-chunk", type=int, default=1)
    p.add_argument(
        "--max-tokens",
        type=int,
        default=64,
        help="tokens per response when the request sets no max_tokens",
    )
    p.add_argument("--ttft-ms", type=float, default=0.0, help="prefill time before the first chunk")
    p.add_argument(
        "--burst",
        type=int,
        default=1,
        help="unpaced only: steps per write per loop turn (default 1)",
    )
    p.add_argument("--model", default="pacer", help="the model name in /v1/models")
    p.add_argument(
        "--no-request-id-echo",
        action="store_true",
        help="answer without the request's x-request-id, as vLLM without "
        "--enable-request-id-headers (the gateway then opens a connection per request)",
    )
    a = p.parse_args(argv)
    cfg = PacerConfig(
        step_ms=a.step_ms,
        tokens_per_chunk=max(1, a.tokens_per_chunk),
        max_tokens=max(1, a.max_tokens),
        ttft_ms=max(0.0, a.ttft_ms),
        burst=max(1, a.burst),
        model=a.model,
        echo_request_id=not a.no_request_id_echo,
    )
    try:
        import uvloop

        uvloop.run(_main(cfg, a.host, a.port))
    except ImportError:
        asyncio.run(_main(cfg, a.host, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
