"""The fault soak: 16 streams through the real gateway while backends fail, on a schedule.

    python -m loadtests.bench.soak                  # ~10 minutes
    python -m loadtests.bench.soak --quick          # one pass of every scenario, ~1 minute
    python -m loadtests.bench.soak --minutes 3 --json out.json

Run from the repository root (it uses `loadtests/harness/gateway.py` and `loadtests/harness/sim.py`). On
loopback only: two simulated vLLM engines serving the same weights (`deep`, dflash7; `shallow`,
mtp3), the real gateway over TLS in front of them (client `agent` goes to deep, client `other`
to shallow, continuation on, idle timeout 2 s, first-byte timeout 3 s), and one client process.
Sixteen workers send chat requests back to back (7 in 8 streamed, 50-400 tokens) for the whole
run, from a raw asyncio + httptools client with a hard deadline per request. The schedule
cycles through the scenarios until the time is up (a pass takes ~70 s); after every pass the
load pauses, the gateway must settle (in-flight 0 in the admin status and the gauge, no queued
request, no upstream socket in CLOSE_WAIT) and RSS and upstream connections are sampled.

Every request is classified from the client's side: `ok` (a complete answer: `[DONE]` once and
last, no error event; or a JSON body), `error` (an OpenAI error: an error event then `[DONE]`,
or a 4xx/5xx with `{"error": {...}}`), or `lost` (cut without `[DONE]`, a hang past the deadline,
a malformed answer, a refused connection). A request belongs to the scenario its lifetime
overlaps. Errors are expected only on the failing backend (`x-specrouter-backend`); an error
anywhere else is counted as `stray`. `lost` and `stray` must be 0.

Time to detect: from the fault to the gateway's first sign of it (the backend's health leaving
`up` in /admin/status, polled every 50 ms, or the first error a client sees on that backend); a
hung engine answers /health, so its sign is the idle timeout. Time to recover: from the fault's
end (the kill's restart, which includes the simulator's ~0.6 s start; faults cleared) to the
backend `up` again and a request served by it. One scenario turns continuation off (a policy
PUT) to show the error-event path. The bad inputs are sent once per pass, under the load, and
must each get their 4xx (or a closed connection for protocol garbage) in bounded time; the
gateway must serve after.

The gateway runs with MALLOC_MMAP_THRESHOLD_=16384 MALLOC_TRIM_THRESHOLD_=0 so that RSS follows
live memory: with glibc's defaults, each new TLS connection's buffers raise the heap's
high-water mark (tens of KB, less as it warms) and RSS climbs for thousands of connections with
no object alive. `--glibc-defaults` measures without them.

Exits 1 when any request was lost or stray, or the gateway did not settle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools
import httpx
import orjson
import yaml

from proxy.vllm_wire import DATA, DONE, DONE_PAYLOAD, ERROR_FRAME_PREFIX

SERVED = "qwen3.8-27b"
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOST = frozenset({"cut", "hung", "bad", "refused"})
LEAN_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "16384", "MALLOC_TRIM_THRESHOLD_": "0"}
ERRORS = frozenset({"error_event", "http_error"})


# -- the gateway process, from /proc ------------------------------------------------------------

def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rfind(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def socket_inodes(pid: int) -> set[int]:
    out: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            target = os.readlink(fd_dir / fd)
            if target.startswith("socket:["):
                out.add(int(target[8:-1]))
    return out


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK",
               "0A": "LISTEN", "0B": "CLOSING"}


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(local port, remote port, state) of every TCP socket the process holds open."""
    inodes = socket_inodes(pid)
    out: list[tuple[int, int, str]] = []
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
            for line in lines:
                f = line.split()
                if int(f[9]) not in inodes:
                    continue
                local, remote = f[1].rsplit(":", 1)[1], f[2].rsplit(":", 1)[1]
                out.append((int(local, 16), int(remote, 16), _TCP_STATES.get(f[3], f[3])))
    return out


def upstream_conns(pid: int, ports: Iterable[int]) -> dict[int, dict[str, int]]:
    """The process's TCP connections to each of `ports`, by state."""
    wanted = set(ports)
    out: dict[int, dict[str, int]] = {p: {} for p in wanted}
    for _, remote, state in tcp_sockets(pid):
        if remote in wanted:
            out[remote][state] = out[remote].get(state, 0) + 1
    return out


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a metric's samples (all label sets, or those with `labels`)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


# -- a raw, cheap HTTP/1.1 client ---------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Target:
    host: str
    port: int
    tls: ssl.SSLContext | None

    @classmethod
    def of(cls, base: str, ca_cert: Path | None) -> Target:
        u = urlsplit(base)
        tls = None
        if u.scheme == "https":
            tls = ssl.create_default_context(cafile=str(ca_cert)) if ca_cert else \
                ssl._create_unverified_context()
        return cls(u.hostname or "127.0.0.1", int(u.port or 443), tls)

    def request(self, path: str, body: bytes, key: str | None, *, method: str = "POST",
                headers: Sequence[tuple[str, str]] = ()) -> bytes:
        lines = [f"{method} {path} HTTP/1.1", f"host: {self.host}:{self.port}",
                 "content-type: application/json", f"content-length: {len(body)}"]
        if key is not None:
            lines.append(f"authorization: Bearer {key}")
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class _Reply:
    """httptools callbacks: one response."""

    __slots__ = ("status", "headers", "body", "complete", "head", "t_first")

    def __init__(self) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.complete = False
        self.head = False
        self.t_first: float | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self.head = True

    def on_body(self, body: bytes) -> None:
        if self.t_first is None:
            self.t_first = time.monotonic()
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class Conn:
    """One keep-alive connection to the gateway."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.used = 0
        self.keep = True

    @classmethod
    async def open(cls, target: Target) -> Conn:
        reader, writer = await asyncio.open_connection(
            target.host, target.port, ssl=target.tls,
            server_hostname=target.host if target.tls is not None else None)
        return cls(reader, writer)

    async def exchange(self, request: bytes, *, until_body: bool = False) -> _Reply:
        """Send one request and read its response (or, with `until_body`, its first body
        bytes). Returns what arrived, complete or not, when the connection ends."""
        reply = _Reply()
        parser = httptools.HttpResponseParser(reply)
        self.used += 1
        self.writer.write(request)
        while not reply.complete:
            data = await self.reader.read(65536)
            if not data:
                self.keep = False
                break
            try:
                parser.feed_data(data)
            except httptools.HttpParserUpgrade:  # pragma: no cover - never asked for
                break
            except httptools.HttpParserError:
                self.keep = False
                break
            if reply.head and not reply.status:
                reply.status = parser.get_status_code()
            if until_body and reply.body:
                break
        if reply.head and not reply.status:
            reply.status = parser.get_status_code()
        if reply.headers.get("connection", "").lower() == "close":
            self.keep = False
        return reply

    def abort(self) -> None:
        """Drop the connection at once, as a client that goes away does."""
        self.keep = False
        transport = self.writer.transport
        transport.abort()

    async def close(self) -> None:
        self.keep = False
        self.writer.close()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1):
                await self.writer.wait_closed()


@dataclass(slots=True)
class Outcome:
    """One request as the client saw it. Times are time.monotonic()."""

    kind: str  # ok, error_event, http_error, cut, hung, bad, refused
    status: int
    backend: str  # x-specrouter-backend ("" when no backend answered)
    t0: float
    t1: float
    worker: int = -1
    stream: bool = True
    detail: str = ""
    t_first: float | None = None
    retry_after: str | None = None
    body: bytes | None = None

    @property
    def lost(self) -> bool:
        return self.kind in LOST

    @property
    def errored(self) -> bool:
        return self.kind in ERRORS


def classify(reply: _Reply | None, stream: bool) -> tuple[str, str]:
    """(kind, detail) of a response as received."""
    if reply is None or not reply.head:
        return "cut", "no response"
    body = bytes(reply.body)
    if not reply.complete:
        return "cut", f"{reply.status}: connection ended mid-body after {len(body)} bytes"
    if reply.status >= 400:
        try:
            err = orjson.loads(body)["error"]
            message = err["message"]
            if not isinstance(message, str) or not message:
                raise KeyError("message")
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            return "bad", f"{reply.status} without an OpenAI error body: {exc}: {body[:120]!r}"
        return "http_error", f"{reply.status} {message[:160]}"
    if reply.status != 200:
        return "bad", f"status {reply.status}"
    if reply.headers.get("content-type", "").startswith("text/event-stream"):
        if not body.endswith(DONE):
            return "cut", f"stream ended without [DONE]: {body[-120:]!r}"
        if body.count(DATA + DONE_PAYLOAD) != 1:
            return "bad", "[DONE] more than once"
        idx = body.find(ERROR_FRAME_PREFIX)
        if idx >= 0:
            end = body.find(b"\n\n", idx)
            try:
                message = str(orjson.loads(body[idx + 6 : end])["error"]["message"])
            except (orjson.JSONDecodeError, KeyError, TypeError):
                return "bad", f"malformed error event {body[idx:end][:160]!r}"
            if body[end + 2 :] != DONE:
                return "bad", "data after the error event"
            return "error_event", message[:160]
        return "ok", ""
    if stream:
        return "bad", f"a stream answered {reply.headers.get('content-type')}"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "cut", f"truncated JSON body ({len(body)} bytes)"
    if not isinstance(data, dict) or "choices" not in data:
        return "bad", f"200 without choices: {body[:120]!r}"
    return "ok", ""


class Requester:
    """Sends requests on a kept-alive connection, reconnecting when it ends."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.conn: Conn | None = None

    async def send(self, request: bytes, *, stream: bool, deadline_s: float, worker: int = -1,
                   keep_body: bool = False) -> Outcome:
        t0 = time.monotonic()
        reply: _Reply | None = None
        try:
            async with asyncio.timeout(deadline_s):
                for attempt in range(2):
                    if self.conn is None or not self.conn.keep:
                        if self.conn is not None:
                            await self.conn.close()
                        try:
                            self.conn = await Conn.open(self.target)
                        except OSError as exc:
                            self.conn = None
                            return Outcome("refused", 0, "", t0, time.monotonic(), worker,
                                           stream, f"{type(exc).__name__}: {exc}")
                    reused = self.conn.used > 0
                    try:
                        reply = await self.conn.exchange(request)
                    except (OSError, ssl.SSLError) as exc:
                        self.conn.keep = False
                        reply = None
                        if reused and attempt == 0:
                            continue  # a kept-alive connection the server had just closed
                        return Outcome("cut", 0, "", t0, time.monotonic(), worker, stream,
                                       f"{type(exc).__name__}: {exc}")
                    if reused and attempt == 0 and not reply.head and not reply.body:
                        continue  # closed by the server between two requests: not an answer
                    break
        except TimeoutError:
            if self.conn is not None:
                self.conn.abort()
                self.conn = None
            return Outcome("hung", reply.status if reply else 0,
                           (reply.headers.get("x-specrouter-backend", "") if reply else ""),
                           t0, time.monotonic(), worker, stream, f"no end in {deadline_s:g}s")
        t1 = time.monotonic()
        kind, detail = classify(reply, stream)
        assert reply is not None
        if not reply.complete and self.conn is not None:
            self.conn.keep = False
        return Outcome(kind, reply.status, reply.headers.get("x-specrouter-backend", ""), t0, t1,
                       worker, stream, detail, reply.t_first, reply.headers.get("retry-after"),
                       bytes(reply.body) if keep_body else None)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None


BodyOf = Callable[[int, int], dict[str, Any]]  # (worker, request number) -> body


def chat_body(worker: int, n: int, *, rng: random.Random | None = None,
              max_tokens: tuple[int, int] = (50, 400), stream_share: float = 0.875
              ) -> dict[str, Any]:
    rng = rng or random.Random(worker * 100_003 + n)
    stream = rng.random() < stream_share
    body: dict[str, Any] = {
        "model": "coder", "stream": stream,
        "max_tokens": rng.randint(*max_tokens) if stream else 30,
        "messages": [{"role": "user", "content": f"Fix the bug in `src/mod{worker}_{n}.py`."}]}
    if stream and rng.random() < 0.5:
        body["stream_options"] = {"include_usage": True}
    return body


class Load:
    """`workers` clients sending requests back to back from a thread of their own, until
    stop(). Worker i uses `keys[i % len(keys)]`."""

    def __init__(self, target: Target, keys: Sequence[str], *, workers: int = 16,
                 body_of: BodyOf = chat_body, deadline_s: float = 30.0,
                 keep_bodies: bool = False) -> None:
        self.target, self.keys, self.workers = target, list(keys), workers
        self.body_of, self.deadline_s, self.keep_bodies = body_of, deadline_s, keep_bodies
        self.outcomes: list[Outcome] = []
        self.sent = 0
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self.error: BaseException | None = None

    def start(self) -> Load:
        self._thread = threading.Thread(target=self._run, name="fault-load", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("load thread did not start")
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by stop()
            self.error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await asyncio.gather(*(self._worker(i) for i in range(self.workers)))

    async def _worker(self, i: int) -> None:
        assert self._stop is not None
        requester = Requester(self.target)
        key = self.keys[i % len(self.keys)]
        n = 0
        try:
            while not self._stop.is_set():
                body = self.body_of(i, n)
                n += 1
                self.sent += 1
                payload = self.target.request("/v1/chat/completions", orjson.dumps(body), key)
                out = await requester.send(payload, stream=body.get("stream") is True,
                                           deadline_s=self.deadline_s, worker=i,
                                           keep_body=self.keep_bodies)
                self.outcomes.append(out)
                if out.kind == "refused":
                    await asyncio.sleep(0.2)
        finally:
            await requester.close()

    def stop(self, timeout: float | None = None) -> list[Outcome]:
        """Stop sending; requests in flight finish (each within the deadline)."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self.deadline_s + 10)
            if self._thread.is_alive():
                raise RuntimeError("load did not stop in time")
        if self.error is not None:
            raise self.error
        return list(self.outcomes)

    def __enter__(self) -> Load:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop()


def run_async(coro: Any, timeout: float) -> Any:
    """Run a coroutine to completion in a thread of its own (the caller may block)."""
    result: list[Any] = []
    error: list[BaseException] = []

    def go() -> None:
        try:
            result.append(asyncio.run(asyncio.wait_for(coro, timeout)))
        except BaseException as exc:
            error.append(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout + 5)
    if t.is_alive():
        raise RuntimeError("async job did not finish")
    if error:
        raise error[0]
    return result[0]


class Background:
    """run_async in the background: start now, `result()` later."""

    def __init__(self, coro: Any, timeout: float) -> None:
        self._out: list[Any] = []
        self._err: list[BaseException] = []
        self.timeout = timeout
        self._t = threading.Thread(target=self._go, args=(coro,), daemon=True)
        self._t.start()

    def _go(self, coro: Any) -> None:
        try:
            self._out.append(asyncio.run(asyncio.wait_for(coro, self.timeout)))
        except BaseException as exc:
            self._err.append(exc)

    def result(self) -> Any:
        self._t.join(self.timeout + 5)
        if self._t.is_alive():
            raise RuntimeError("background job did not finish")
        if self._err:
            raise self._err[0]
        return self._out[0]


async def burst(target: Target, requests: Sequence[tuple[str, dict[str, Any]]], *,
                deadline_s: float, keep_bodies: bool = True) -> list[Outcome]:
    """One request per (key, body), all at once, each on its own connection."""
    async def one(i: int, key: str, body: dict[str, Any]) -> Outcome:
        r = Requester(target)
        try:
            return await r.send(target.request("/v1/chat/completions", orjson.dumps(body), key),
                                stream=body.get("stream") is True, deadline_s=deadline_s,
                                worker=i, keep_body=keep_bodies)
        finally:
            await r.close()
    return list(await asyncio.gather(*(one(i, k, b) for i, (k, b) in enumerate(requests))))


async def disconnects(target: Target, key: str, n: int, *, concurrency: int = 32,
                      max_tokens: int = 4000, timeout_each: float = 20.0,
                      on_progress: Callable[[int], None] | None = None) -> Counter[str]:
    """`n` streaming requests, each dropped (TCP abort) as soon as its first body bytes arrive,
    so the upstream generation has begun and must be aborted. Returns what each saw before the
    drop: `dropped` (a 200 stream began), or its status / failure."""
    seen: Counter[str] = Counter()
    body = orjson.dumps({"model": "coder", "stream": True, "max_tokens": max_tokens,
                         "messages": [{"role": "user", "content": "Write a long module."}]})
    request = target.request("/v1/chat/completions", body, key)
    todo = iter(range(n))
    done = 0

    async def worker() -> None:
        nonlocal done
        for _ in todo:
            try:
                async with asyncio.timeout(timeout_each):
                    conn = await Conn.open(target)
                    try:
                        reply = await conn.exchange(request, until_body=True)
                    finally:
                        conn.abort()
                seen["dropped" if reply.status == 200 and reply.body else
                     f"status {reply.status}"] += 1
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                seen[type(exc).__name__] += 1
            done += 1
            if on_progress is not None:
                on_progress(done)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return seen


# -- the gateway as the admin listener shows it -------------------------------------------------

@dataclass(slots=True)
class Settled:
    """The gateway once idle: all of it must be zero but the pooled upstream connections."""

    in_flight: int
    gauge: float
    queued: float
    upstream: dict[int, dict[str, int]]
    rss_kb: int
    fds: int
    waited_s: float

    def established(self, port: int | None = None) -> int:
        return sum(s.get("ESTABLISHED", 0) for p, s in self.upstream.items()
                   if port is None or p == port)

    def close_wait(self) -> int:
        return sum(s.get("CLOSE_WAIT", 0) for s in self.upstream.values())


def settle(gw: Any, ports: Iterable[int], *, timeout: float = 15.0) -> Settled:
    """Wait until nothing is in flight and no upstream socket waits to be closed; the state
    then. Raises AssertionError with the last reading when it does not settle in time."""
    pid = gw.proc.pid
    ports = list(ports)
    start = time.monotonic()
    last = ""
    while True:
        status = gw.admin_get("/admin/status").json()
        metrics = gw.metrics()
        gauge = metric_sum(metrics, "specrouter_in_flight")
        queued = metric_sum(metrics, "specrouter_queued")
        conns = upstream_conns(pid, ports)
        state = Settled(int(status["in_flight"]), gauge, queued, conns, rss_kb(pid),
                        len(os.listdir(f"/proc/{pid}/fd")), time.monotonic() - start)
        if state.in_flight == 0 and gauge == 0 and queued == 0 and state.close_wait() == 0:
            return state
        last = repr(state)
        if time.monotonic() - start > timeout:
            raise AssertionError(f"the gateway did not settle in {timeout:g}s: {last}")
        time.sleep(0.1)


class HealthWatch:
    """Polls /admin/status every `every` seconds: each backend's health over time."""

    def __init__(self, gw: Any, every: float = 0.05) -> None:
        self.gw, self.every = gw, every
        self.timeline: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="health-watch", daemon=True)

    def __enter__(self) -> HealthWatch:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as c:
            while not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                    data = c.get(self.gw.admin + "/admin/status",
                                 headers={"authorization": f"Bearer {self._token()}"}).json()
                    self.timeline.append((time.monotonic(), {
                        n: b["health"] for n, b in data["backends"].items()}))
                self._stop.wait(self.every)

    def _token(self) -> str:
        from loadtests.harness.gateway import ADMIN_TOKEN

        return ADMIN_TOKEN

    def health(self, name: str) -> str:
        return self.timeline[-1][1].get(name, "up") if self.timeline else "up"

    def first(self, name: str, pred: Callable[[str], bool], after: float) -> float | None:
        for t, states in list(self.timeline):
            if t >= after and pred(states.get(name, "up")):
                return t
        return None

    def transitions(self, name: str) -> list[tuple[float, str]]:
        out: list[tuple[float, str]] = []
        for t, states in list(self.timeline):
            h = states.get(name, "up")
            if not out or out[-1][1] != h:
                out.append((t, h))
        return out

    def wait(self, name: str, pred: Callable[[str], bool], timeout: float) -> float:
        end = time.monotonic() + timeout
        since = time.monotonic()
        while time.monotonic() < end:
            t = self.first(name, pred, since)
            if t is not None:
                return t
            time.sleep(self.every)
        raise AssertionError(f"{name}: health condition not reached in {timeout:g}s; "
                             f"transitions {self.transitions(name)[-6:]}")


# -- the soak -----------------------------------------------------------------------------------

@dataclass(slots=True)
class ScenarioRun:
    name: str
    failing: str | None  # the backend that fails, if any
    start: float
    end: float = 0.0  # the fault's end (restart, faults cleared)
    settle_end: float = 0.0  # the window closes here (recovered, or a grace after the end)
    detect_s: float | None = None
    recover_s: float | None = None
    continued: float = 0.0
    note: str = ""


@dataclass(slots=True)
class Row:
    scenario: str
    runs: int = 0
    sent: int = 0
    ok: int = 0
    lost: int = 0
    errored: int = 0
    stray: int = 0
    continued: int = 0
    detect_s: list[float] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    lost_examples: list[str] = field(default_factory=list)


@dataclass(slots=True)
class BadInput:
    what: str
    expected: str
    got: str
    ms: float
    ok: bool


@dataclass(slots=True)
class Pass:
    n: int
    in_flight: int
    gauge: float
    queued: float
    upstream_established: int
    close_wait: int
    rss_kb: int
    fds: int
    settle_s: float


class Soak:
    def __init__(self, *, minutes: float, quick: bool, seed: int = 0, lean_malloc: bool = True,
                 log: Callable[[str], None] = print) -> None:
        self.minutes, self.quick, self.log = minutes, quick, log
        self.lean_malloc = lean_malloc
        self.rng = random.Random(seed)
        self.runs: list[ScenarioRun] = []
        self.passes: list[Pass] = []
        self.bad: list[BadInput] = []
        self.outcomes: list[Outcome] = []
        self.t_start = 0.0
        self.t_end = 0.0
        self.rss_start = self.rss_end = self.rss_max = 0
        self.cpu_s = 0.0
        self.gateway_cpu_pct = 0.0
        self.load: Load | None = None

    # ---- setup --------------------------------------------------------------------------

    def run(self) -> None:
        from loadtests.harness.gateway import CLIENT_KEY, OTHER_KEY, GatewayServer, coder_policy
        from loadtests.harness.sim import SimServer
        from proxy.certs import make_local_ca

        if self.lean_malloc:
            # glibc keeps freed memory (each new TLS connection's buffers raise the heap's
            # high-water mark); with these, RSS follows what is alive. Allocator settings only.
            os.environ.update(LEAN_MALLOC)
        with tempfile.TemporaryDirectory(prefix="specrouter-faults-") as tmp, \
                SimServer("dflash7-prob-block", served_model_name=SERVED, time_scale=0.05,
                          max_num_seqs=64) as deep, \
                SimServer("mtp3", served_model_name=SERVED, time_scale=0.05,
                          max_num_seqs=64) as shallow:
            certs = make_local_ca(Path(tmp) / "tls")
            policy = coder_policy(
                {"deep": deep.url, "shallow": shallow.url},
                rules=[{"name": "other-shallow", "kind": "client", "clients": ["other"],
                        "use": "shallow"}])
            for b in policy["backends"].values():
                b.update({"startup_s": 0, "max_concurrency": 64})
            policy["routes"]["coder"]["continuation"] = True
            policy["health"] = {"fail_after": 2, "recover_after": 2}
            args = ("--idle-timeout", "2", "--first-byte-timeout", "3", "--drain-timeout", "3",
                    "--header-timeout", "2", "--body-timeout", "2")
            with GatewayServer(policy, certs=certs, args=args) as gw, HealthWatch(gw) as watch:
                self.gw, self.watch = gw, watch
                self.sims = {"deep": deep, "shallow": shallow}
                self.target = Target.of(gw.base, certs.ca_cert)
                self.keys = {"deep": CLIENT_KEY, "shallow": OTHER_KEY}
                self._soak()

    def _soak(self) -> None:
        assert self.gw.proc is not None
        pid = self.gw.proc.pid
        ports = [s.port for s in self.sims.values()]
        # Warm-up: a few seconds of load so RSS at start is past the first allocations.
        with Load(self.target, [self.keys["deep"], self.keys["shallow"]],
                  deadline_s=30) as warm:
            time.sleep(3)
        self.outcomes += warm.stop()
        settle(self.gw, ports)
        self.rss_start = self.rss_max = rss_kb(pid)
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        self.t_start = t0
        budget = self.minutes * 60.0
        scenarios = self._scenarios()
        n = 0
        while True:
            n += 1
            self.log(f"pass {n}: {time.monotonic() - t0:.0f}s of {budget:.0f}s")
            load = self.load = Load(self.target, [self.keys["deep"], self.keys["shallow"]],
                                    deadline_s=30).start()
            try:
                for name, fn in scenarios:
                    if not self.quick and time.monotonic() - t0 > budget:
                        break
                    self._quiet(2.0)
                    self.log(f"  {name}")
                    fn()
                    self.rss_max = max(self.rss_max, rss_kb(pid))
                self._quiet(2.0)
            finally:
                self.outcomes += load.stop()
                self.load = None
            state = settle(self.gw, ports, timeout=20)
            self.passes.append(Pass(n, state.in_flight, state.gauge, state.queued,
                                    state.established(), state.close_wait(), state.rss_kb,
                                    state.fds, state.waited_s))
            self.rss_max = max(self.rss_max, state.rss_kb)
            if self.quick or time.monotonic() - t0 > budget:
                break
        self.t_end = time.monotonic()
        self.cpu_s = cpu_seconds(pid) - cpu0
        self.gateway_cpu_pct = 100.0 * self.cpu_s / (self.t_end - t0)
        self.rss_end = rss_kb(pid)

    def _quiet(self, seconds: float) -> None:
        time.sleep(seconds)

    def _scenarios(self) -> list[tuple[str, Callable[[], None]]]:
        return [
            ("kill deep", lambda: self._kill("deep")),
            ("hang deep (idle timeout)", lambda: self._hang("deep")),
            ("500 on shallow before first byte", lambda: self._status("shallow", "http_500")),
            ("503 on deep before first byte", lambda: self._status("deep", "http_503")),
            ("deep dies mid-stream (continued)", lambda: self._die("deep")),
            ("shallow dies mid-stream (continuation off)", lambda: self._die("shallow", False)),
            ("health flapping (shallow)", lambda: self._flap("shallow")),
            ("policy changes", self._policy),
            ("kill shallow", lambda: self._kill("shallow")),
            ("200 client disconnects", self._disconnects),
            ("bad inputs", self._bad_inputs),
        ]

    # ---- scenarios ----------------------------------------------------------------------

    def _begin(self, name: str, failing: str | None) -> ScenarioRun:
        run = ScenarioRun(name, failing, time.monotonic())
        run.continued = -self._continued()
        self.runs.append(run)
        return run

    def _continued(self) -> float:
        return metric_sum(self.gw.metrics(), "specrouter_continuations_total")

    def _finish(self, run: ScenarioRun, recovered: bool = True) -> None:
        """Close the window: wait for the backend to be up and to serve again."""
        name = run.failing
        if name is not None and recovered:
            try:
                t_up = self.watch.wait(name, lambda h: h == "up", timeout=20)
                served = self._served_by(name, after=t_up, timeout=10)
                run.recover_s = max(t_up, served) - run.end
            except AssertionError as exc:
                run.note = str(exc)[:200]
        time.sleep(0.5)
        run.settle_end = time.monotonic()
        run.continued += self._continued()

    def _served_by(self, name: str, after: float, timeout: float) -> float:
        """When a request first went to `name` and came back ok after `after`."""
        end = time.monotonic() + timeout
        key = self.keys[name]
        while time.monotonic() < end:
            body = {"model": "coder", "max_tokens": 4,
                    "messages": [{"role": "user", "content": "ping"}]}
            out: Outcome = run_async(burst(self.target, [(key, body)], deadline_s=10), 15)[0]
            self.outcomes.append(out)
            if out.kind == "ok" and out.backend == name and out.t0 >= after:
                return out.t1
            time.sleep(0.1)
        raise AssertionError(f"{name} did not serve again in {timeout:g}s")

    def _detect(self, run: ScenarioRun, name: str, timeout: float = 10.0) -> None:
        """The first sign of the fault: health leaves `up`, or a client sees an error from it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            t = self.watch.first(name, lambda h: h != "up", run.start)
            errs = [o.t1 for o in self._live_outcomes() if o.errored and o.backend == name
                    and o.t1 >= run.start]
            cands = [x for x in (t, min(errs, default=None)) if x is not None]
            if cands:
                run.detect_s = min(cands) - run.start
                return
            time.sleep(0.05)

    def _live_outcomes(self) -> list[Outcome]:
        return list(self.load.outcomes) if self.load is not None else []

    def _kill(self, name: str) -> None:
        run = self._begin(f"kill {name}", name)
        sim = self.sims[name]
        sim.kill()
        self._detect(run, name)
        time.sleep(3.0)
        run.end = time.monotonic()
        sim.restart()
        self._finish(run)

    def _hang(self, name: str) -> None:
        run = self._begin(f"hang {name} (idle timeout 2 s)", name)
        sim = self.sims[name]
        sim.fault("hang")
        self._detect(run, name)
        time.sleep(max(0.0, 4.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)

    def _status(self, name: str, mode: str) -> None:
        run = self._begin(f"{mode[5:]} on {name} before the first byte", name)
        sim = self.sims[name]
        sim.fault(mode)
        self._detect(run, name)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)

    def _die(self, name: str, continuation: bool = True) -> None:
        if not continuation:
            self._set_continuation(False)
            time.sleep(1.5)  # requests in flight keep the policy they began with
        run = self._begin(f"{name} dies mid-stream (continuation "
                          f"{'on' if continuation else 'off'})", name)
        sim = self.sims[name]
        sim.fault("die_mid_stream", after_chunks=5)
        self._detect(run, name)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - run.start)))
        run.end = time.monotonic()
        sim.clear_faults()
        self._finish(run)
        if not continuation:
            self._set_continuation(True)

    def _set_continuation(self, on: bool) -> None:
        from loadtests.harness.gateway import ADMIN_TOKEN

        with httpx.Client(base_url=self.gw.admin, timeout=10,
                          headers={"authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
            cur = admin.get("/admin/policy")
            doc = cur.json()["document"]
            doc["routes"]["coder"]["continuation"] = on
            r = admin.put("/admin/policy", content=yaml.safe_dump(doc),
                          headers={"if-match": cur.headers["etag"]})
            r.raise_for_status()

    def _flap(self, name: str) -> None:
        run = self._begin(f"health flapping ({name}, 4 cycles)", name)
        sim = self.sims[name]
        for _ in range(4):
            # /health fails and new requests get 503. (health_fail alone does not take down a
            # backend that serves traffic: each request served resets its failure count.)
            sim.fault("health_fail")
            sim.fault("http_503")
            if run.detect_s is None:
                self._detect(run, name, timeout=1.0)
            time.sleep(1.0)
            sim.clear_faults()
            time.sleep(1.0)
        run.end = time.monotonic()
        self._finish(run)
        downs = sum(1 for t, h in self.watch.transitions(name)
                    if run.start <= t <= run.settle_end and h == "down")
        run.note = f"went down {downs} times in 4 cycles"

    def _policy(self) -> None:
        run = self._begin("policy changes (12 PUTs, 1 stale, 1 invalid)", None)
        from loadtests.harness.gateway import ADMIN_TOKEN

        auth = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        statuses: Counter[int] = Counter()
        with httpx.Client(base_url=self.gw.admin, headers=auth, timeout=10) as admin:
            for i in range(12):
                cur = admin.get("/admin/policy")
                doc = cur.json()["document"]
                route = doc["routes"]["coder"]
                route["defaults"] = {"temperature": round(0.5 + 0.05 * i, 2)}
                route["variants"] = ["deep", "shallow"] if i % 2 == 0 else ["shallow", "deep"]
                rule = route["rules"][0]
                rule["use"] = "shallow" if i % 3 else "deep"
                if i == 11:  # back to the soak's own routing
                    route["variants"], rule["use"] = ["deep", "shallow"], "shallow"
                r = admin.put("/admin/policy", content=yaml.safe_dump(doc),
                              headers={"if-match": cur.headers["etag"]})
                statuses[r.status_code] += 1
                if i == 5:
                    stale = admin.put("/admin/policy", content=yaml.safe_dump(doc),
                                      headers={"if-match": cur.headers["etag"]})
                    statuses[stale.status_code] += 1
                    bad = dict(doc, routes={"coder": dict(route, variants=["nowhere"])})
                    cur2 = admin.get("/admin/policy")
                    invalid = admin.put("/admin/policy", content=yaml.safe_dump(bad),
                                        headers={"if-match": cur2.headers["etag"]})
                    statuses[invalid.status_code] += 1
                time.sleep(0.25)
        run.end = time.monotonic()
        run.note = "PUT statuses " + " ".join(f"{k}x{v}" for k, v in sorted(statuses.items()))
        self._finish(run)

    def _disconnects(self) -> None:
        run = self._begin("200 client disconnects", None)
        before = {n: s.stats() for n, s in self.sims.items()}
        gone0 = metric_sum(self.gw.metrics(), "specrouter_client_disconnects_total")
        seen = run_async(disconnects(self.target, self.keys["deep"], 200, concurrency=16), 120)
        deadline = time.monotonic() + 15
        aborted = 0
        while time.monotonic() < deadline:
            aborted = sum(s.stats()["aborted"] - before[n]["aborted"]
                          for n, s in self.sims.items())
            if aborted >= seen["dropped"]:
                break
            time.sleep(0.1)
        gone = metric_sum(self.gw.metrics(), "specrouter_client_disconnects_total") - gone0
        run.end = time.monotonic()
        run.note = (f"dropped {seen['dropped']}, upstream aborts {aborted}, gateway counted "
                    f"{gone:.0f}, in {run.end - run.start:.1f}s"
                    + ("" if seen["dropped"] == 200 else f" ({dict(seen)})"))
        if aborted != seen["dropped"] or seen["dropped"] != 200:
            run.note += " MISMATCH"
        self._finish(run, recovered=False)

    def _bad_inputs(self) -> None:
        run = self._begin("bad inputs", None)
        results = run_async(try_bad_inputs(self.target, self.keys["deep"]), 120)
        if not self.bad:
            self.bad = results
        else:
            for prev, new in zip(self.bad, results, strict=True):
                if not new.ok:
                    self.bad[self.bad.index(prev)] = new
        run.end = time.monotonic()
        bad = [b.what for b in results if not b.ok]
        run.note = f"{len(results)} inputs, {len(bad)} unexpected" + (f": {bad}" if bad else "")
        self._finish(run, recovered=False)

    # ---- the table ----------------------------------------------------------------------

    def rows(self) -> list[Row]:
        by_name: dict[str, Row] = {}
        order: list[str] = []

        def row(name: str) -> Row:
            if name not in by_name:
                by_name[name] = Row(name)
                order.append(name)
            return by_name[name]

        steady = Row("steady load (no fault)")
        for run in self.runs:
            r = row(run.name)
            r.runs += 1
            r.continued += int(round(run.continued))
            if run.detect_s is not None:
                r.detect_s.append(run.detect_s)
            if run.recover_s is not None:
                r.recover_s.append(run.recover_s)
        runs = sorted(self.runs, key=lambda r: r.start)
        for o in self.outcomes:
            if o.t0 < self.t_start:
                continue
            owner = next((r for r in runs if o.t0 <= r.settle_end and o.t1 >= r.start), None)
            r = steady if owner is None else by_name[owner.name]
            failing = None if owner is None else owner.failing
            r.sent += 1
            if o.lost:
                r.lost += 1
                if len(r.lost_examples) < 5:
                    r.lost_examples.append(f"{o.kind} {o.backend or '-'} {o.detail}")
            elif o.errored:
                if failing is not None and o.backend in (failing, ""):
                    r.errored += 1
                else:
                    r.stray += 1
                    if len(r.lost_examples) < 5:
                        r.lost_examples.append(f"stray {o.kind} {o.backend or '-'} {o.detail}")
            else:
                r.ok += 1
        steady.runs = len(self.passes)
        return [by_name[n] for n in order] + [steady]

    def report(self) -> dict[str, Any]:
        return {
            "minutes": round((self.t_end - self.t_start) / 60, 2),
            "quick": self.quick,
            "passes": [asdict(p) for p in self.passes],
            "rows": [asdict(r) for r in self.rows()],
            "runs": [asdict(r) for r in self.runs],
            "bad_inputs": [asdict(b) for b in self.bad],
            "rss_kb": {"start": self.rss_start, "max": self.rss_max, "end": self.rss_end},
            "gateway_cpu_s": round(self.cpu_s, 1),
            "gateway_cpu_pct": round(self.gateway_cpu_pct, 1),
            "allocator": (" ".join(f"{k}={v}" for k, v in LEAN_MALLOC.items())
                          if self.lean_malloc else "glibc defaults"),
            "requests": len([o for o in self.outcomes if o.t0 >= self.t_start]),
        }

    def failed(self) -> list[str]:
        out = []
        for r in self.rows():
            if r.lost or r.stray:
                out.append(f"{r.scenario}: {r.lost} lost, {r.stray} stray: {r.lost_examples}")
        for p in self.passes:
            if p.in_flight or p.gauge or p.queued or p.close_wait:
                out.append(f"pass {p.n} did not settle: {p}")
        for run in self.runs:
            if "MISMATCH" in run.note:
                out.append(f"{run.name}: {run.note}")
        out += [f"bad input {b.what}: expected {b.expected}, got {b.got}"
                for b in self.bad if not b.ok]
        return out


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    med = values[len(values) // 2]
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Fault soak: {report['minutes']} min, {len(report['passes'])} pass(es), "
        f"{report['requests']} requests from 16 workers (+ probes and disconnects).",
        "",
        "| scenario | runs | requests | ok | lost | errored | stray errors | continued | "
        "detect s | recover s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['runs']} | {r['sent']} | {r['ok']} | {r['lost']} | "
            f"{r['errored']} | {r['stray']} | {r['continued']} | {_span(r['detect_s'])} | "
            f"{_span(r['recover_s'])} |")
    rss = report["rss_kb"]
    lines += [
        "",
        "detect/recover: median (min-max) over the runs. errored: clear errors on the failing "
        "backend (an error event then [DONE], or an OpenAI error with Retry-After); stray: "
        "errors anywhere else; lost: cut, hung or malformed.",
        "",
        f"Gateway RSS: {rss['start'] / 1024:.1f} MiB at start (after warm-up), "
        f"{rss['max'] / 1024:.1f} MiB max, {rss['end'] / 1024:.1f} MiB at the end. "
        f"Gateway CPU: {report['gateway_cpu_s']} s, {report['gateway_cpu_pct']}% of one core "
        f"over the soak. Allocator: {report.get('allocator', '?')}.",
        "",
        "After each pass (load paused): "
        + "; ".join(f"#{p['n']} in-flight {p['in_flight']}, gauge {p['gauge']:g}, "
                    f"upstream conns {p['upstream_established']} (CLOSE_WAIT {p['close_wait']}),"
                    f" RSS {p['rss_kb'] / 1024:.1f} MiB, fds {p['fds']}"
                    for p in report["passes"]),
    ]
    uniq = list(dict.fromkeys(f"- {r['name']}: {r['note']}" for r in report["runs"]
                              if r["note"]))
    if uniq:
        lines += ["", "Notes:", *uniq[:20]]
    if report["bad_inputs"]:
        lines += ["", "| bad input | expected | got | ms |", "|---|---|---|---:|"]
        for b in report["bad_inputs"]:
            mark = "" if b["ok"] else " **UNEXPECTED**"
            lines.append(f"| {b['what']} | {b['expected']} | {b['got']}{mark} | {b['ms']:.0f} |")
    return "\n".join(lines)


# -- bad inputs ---------------------------------------------------------------------------------

# (what, raw request bytes builder, expectation): a status class ("4xx"), an exact status with
# an OpenAI error body ("400"), a status from the HTTP layer before any request exists, with an
# empty body ("408 raw"), or "cut" (the connection is closed, with or without a 4xx first).
RawCase = tuple[str, Callable[[Target, str], bytes], str]


def _post(path: str, body: bytes, *, headers: Sequence[tuple[str, str]] = (),
          key: bool = True) -> Callable[[Target, str], bytes]:
    return lambda t, k: t.request(path, body, k if key else None, headers=headers)


_CHAT = "/v1/chat/completions"
BAD_INPUTS: list[RawCase] = [
    ("empty body", _post(_CHAT, b""), "400"),
    ("not JSON", _post(_CHAT, b"hello"), "400"),
    ("truncated JSON", _post(_CHAT, b'{"model": "coder", "messages": ['), "400"),
    ("invalid UTF-8", _post(_CHAT, b'{"model": "c\xff\xfeoder", "messages": []}'), "400"),
    ("JSON array", _post(_CHAT, b'[{"model": "coder"}]'), "400"),
    ("deep nesting", _post(_CHAT, b'{"model":"coder","messages":' + b"[" * 5000 + b"]" * 5000
                           + b"}"), "400"),
    ("no model", _post(_CHAT, b'{"messages": []}'), "400"),
    ("model is a number", _post(_CHAT, b'{"model": 7, "messages": []}'), "400"),
    ("unknown model", _post(_CHAT, b'{"model": "gpt-9", "messages": []}'), "404"),
    ("NaN temperature", _post(_CHAT, b'{"model": "coder", "messages": [], "temperature": NaN}'),
     "400"),
    ("huge max_tokens", _post(_CHAT, b'{"model": "coder", "messages": [{"role": "user", '
                              b'"content": "x"}], "max_tokens": 1234567890123456789012345}'),
     "4xx"),
    ("negative max_tokens", _post(_CHAT, b'{"model": "coder", "messages": [{"role": "user", '
                                  b'"content": "x"}], "max_tokens": -1}'), "4xx"),
    ("stream is not a bool", _post(_CHAT, b'{"model": "coder", "messages": [], "stream": [1]}'),
     "4xx"),
    ("body over the size limit", _post(_CHAT, b'{"model": "coder", "pad": "' + b"x" * 9_000_000
                                       + b'"}'), "413"),
    ("no API key", _post(_CHAT, b'{"model": "coder", "messages": []}', key=False), "401"),
    ("wrong API key", lambda t, k: t.request(_CHAT, b'{"model":"coder"}', "sk-wrong"), "401"),
    ("pinned unknown variant", _post(_CHAT, b'{"model": "coder", "messages": []}',
                                     headers=[("x-specrouter-variant", "nope")]), "400"),
    ("GET on a POST endpoint", lambda t, k: t.request(_CHAT, b"", k, method="GET"), "405"),
    ("unknown path", lambda t, k: t.request("/v1/nothing", b"{}", k), "404"),
    ("admin path on the public listener", lambda t, k: t.request("/admin/policy", b"{}", k,
                                                                 method="GET"), "404"),
    ("metrics on the public listener", lambda t, k: t.request("/metrics", b"", k, method="GET"),
     "404"),
    ("header over 64 KiB", lambda t, k: t.request(_CHAT, b"{}", k,
                                                  headers=[("x-pad", "a" * 100_000)]),
     "431"),
    ("content-length larger than the body (slow body)",
     lambda t, k: t.request(_CHAT, b"", k).replace(b"content-length: 0",
                                                   b"content-length: 100") + b'{"mod', "408"),
    ("headers never finished (slow headers)",
     lambda t, k: b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n", "408"),
    ("garbage instead of HTTP", lambda t, k: b"\x00\x01\x02garbage\r\n\r\n", "cut"),
    ("invalid chunked encoding",
     lambda t, k: (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer "
                   + k.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\nZZ\r\n{}\r\n0\r\n\r\n"),
     "cut"),
    ("HTTP/1.1 request without TLS", lambda t, k: b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n",
     "tls"),
]


async def _try_one(target: Target, key: str, what: str, build: Callable[[Target, str], bytes],
                   expected: str) -> BadInput:
    t0 = time.monotonic()
    got = ""
    try:
        async with asyncio.timeout(15):
            if expected == "tls":
                # Plain bytes to the TLS port: the handshake fails, the connection is closed.
                reader, writer = await asyncio.open_connection(target.host, target.port)
                writer.write(build(target, key))
                data = await reader.read(1024)
                writer.close()
                if not data:
                    got = "closed"
                elif data.startswith(b"HTTP/1.1 "):
                    got = data[9:12].decode("latin-1") + " raw"
                else:
                    got = f"closed (after {len(data)} bytes of TLS alert)"
            else:
                conn = await Conn.open(target)
                try:
                    reply = await conn.exchange(build(target, key))
                finally:
                    await conn.close()
                got = str(reply.status) if reply.head else "closed"
                if reply.head and reply.status >= 400:
                    kind, detail = classify(reply, False)
                    if kind != "http_error":
                        got += " raw" if not reply.body or expected == "cut" else \
                            f" (not an OpenAI error: {detail[:60]})"
    except TimeoutError:
        got = "hang (15 s)"
    except (OSError, ssl.SSLError) as exc:
        got = f"closed ({type(exc).__name__})"
    ms = (time.monotonic() - t0) * 1000
    status = got[:3]
    if expected == "4xx":  # an OpenAI error, whatever the 4xx
        ok = status[:1] == "4" and len(got) == 3
    elif expected in ("cut", "tls"):  # closed, with or without a 4xx before
        ok = got.startswith("closed") or status[:1] == "4"
    elif expected.endswith(" raw"):  # the HTTP layer's answer, before any request exists
        ok = got in (expected, status) and status == expected[:3]
    else:
        ok = got == expected
    return BadInput(what, expected, got, ms, ok)


async def try_bad_inputs(target: Target, key: str) -> list[BadInput]:
    """Every bad input, four at a time, then a good request (the gateway still serves)."""
    sem = asyncio.Semaphore(4)

    async def one(case: RawCase) -> BadInput:
        async with sem:
            return await _try_one(target, key, *case)

    out = list(await asyncio.gather(*(one(c) for c in _cases())))
    r = Requester(target)
    body = orjson.dumps({"model": "coder", "max_tokens": 4,
                         "messages": [{"role": "user", "content": "still there?"}]})
    after = await r.send(target.request(_CHAT, body, key), stream=False, deadline_s=10)
    await r.close()
    out.append(BadInput("a good request after all of these", "200",
                        str(after.status) if after.status else after.kind,
                        (after.t1 - after.t0) * 1000, after.kind == "ok"))
    return out


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else str(value)


def _cases() -> list[RawCase]:
    """The cases above, plus the hand-made malformed bodies of tests/relay/test_hostile_openapi.py
    when that module (and schemathesis) can be imported."""
    cases = list(BAD_INPUTS)
    try:
        from tests.relay.test_hostile_openapi import _BAD
    except Exception:  # noqa: BLE001 - optional: needs the dev extras and the tests package
        return cases
    ours = {c[0] for c in cases}
    for what, body, headers, status in _BAD:
        if what in ours or status == 413 or b"embedding" in body:
            continue  # against that suite's own gateway: a 64 KiB body limit, an embed route
        hdrs = [(_text(k), _text(v)) for k, v in dict(headers).items()]
        cases.append((f"{what} (hostile suite)", _post(_CHAT, body, headers=hdrs), str(status)))
    return cases


# -- command line -------------------------------------------------------------------------------

def _install_signals() -> None:
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    p.add_argument("--quick", action="store_true", help="one pass of every scenario (~1 min)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--glibc-defaults", action="store_true",
                   help="run the gateway with glibc's default allocator settings (RSS then also "
                        "shows freed memory glibc keeps)")
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.minutes > 240:
        p.error("--minutes must be in (0, 240]")
    _install_signals()
    if not Path("loadtests/harness/gateway.py").exists():
        p.error("run from the repository root (needs loadtests/harness/gateway.py)")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    soak = Soak(minutes=args.minutes, quick=args.quick, seed=args.seed,
                lean_malloc=not args.glibc_defaults,
                log=lambda m: print(m, file=sys.stderr, flush=True))
    started = time.monotonic()
    # A hard bound on the whole run, whatever hangs: the schedule, plus a pass, plus slack.
    limit = args.minutes * 60 + 300 if not args.quick else 600
    timer = threading.Timer(limit, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    try:
        soak.run()
    finally:
        timer.cancel()
    report = soak.report()
    report["wall_s"] = round(time.monotonic() - started, 1)
    failures = soak.failed()
    report["failures"] = failures
    print(render(report))
    if failures:
        print("\nFAILED:\n" + "\n".join(f"- {f}" for f in failures))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failures else 0


def iter_outcomes(outcomes: Iterable[Outcome], *, backend: str | None = None,
                  kinds: Iterable[str] | None = None) -> Iterator[Outcome]:
    wanted = None if kinds is None else set(kinds)
    for o in outcomes:
        if (backend is None or o.backend == backend) and (wanted is None or o.kind in wanted):
            yield o


if __name__ == "__main__":
    raise SystemExit(main())
