"""What the gateway adds over direct access (and over nginx), measured in one run.

    python -m loadtests.bench.overhead            # full run, ~4-5 minutes
    python -m loadtests.bench.overhead --quick    # ~1 minute
    python -m loadtests.bench.overhead --json out.json

It starts, on loopback only:
- the pacer (`loadtests/bench/pacer.py`), a vLLM-shaped SSE backend that costs next to nothing;
- the real gateway (`specrouter serve`, TLS with a throwaway local CA) in front of it;
- nginx as a TLS reverse proxy in front of it (`proxy_buffering off`, keepalive upstream), when
  an `nginx` binary is on PATH (or in /usr/sbin); otherwise that column is skipped;
and drives them from one load-client process (raw asyncio protocol + httptools on uvloop,
connections opened and kept alive before each round, so no TLS handshake falls inside a TTFT).

Rounds alternate direct / gateway / nginx within each repeat (the order rotates per repeat) and
replay the same arrival pattern on each target: agents arrive staggered (exponential gaps) and
think between requests, as coding agents do between turns. Per repeat:
- `ttft1`: one stream, short responses: TTFT p50.
- `paced16`: 16 streams, 30 ms step: TTFT p50, p99 of the gap between decode chunks, and the
  proxy's CPU per relayed chunk (utime+stime from /proc/PID/stat over the round, divided by the
  SSE events the clients received, [DONE] excluded; per-request work is included, spread over
  the response's chunks).
- `sat`: 16 streams with the pacer as fast as possible: chunks/s through the target and CPU per
  chunk, over a fixed window after a warm-up; the streams are then dropped (client disconnect).
And, once, right after the warm-up: `rss256`, 256 streams open at once (100 ms step), the
proxy's resident memory sampled while all 256 stream. The proxies' RSS idle (after the warm-up)
and at the end of the run are shown too: the unpaced `sat` streams are long (thousands of chunks
each), so whatever a proxy keeps per chunk of a finished request shows up there.

"Added" figures are per repeat (target round minus the direct round of the same repeat); the table
gives medians over repeats, the spread (min-max) and the run count, with the targets of issue 3
beside them. The machine is small and shared: read the spread, and rerun before believing a
single figure. Timing claims live here, never in the tests.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import random
import re
import resource
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, cast

import httptools
import orjson
import yaml

from proxy import auth
from proxy.certs import CertFiles, make_local_ca

BENCH_KEY = "sk-bench-overhead"
ADMIN_TOKEN = "bench-admin-token-of-thirty-two-chars"  # 32+: the gateway refuses less
MODEL = "pacer"
TARGETS = ("direct", "gateway", "nginx")
CLK_TCK = os.sysconf("SC_CLK_TCK")

# Targets of issue 3 (2-core machine): metric -> (comparison, bound).
GOALS: dict[str, tuple[str, float]] = {
    "ttft1_added_ms": ("<=", 1.5),
    "ttft16_added_ms": ("<=", 2.0),
    "gap99_added_ms": ("<=", 0.5),
    "cpu_paced_us": ("<=", 100.0),
    "cpu_sat_us": ("<=", 30.0),
    "rss256_mb": ("<", 200.0),
}


# --------------------------------------------------------------------------- child processes


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the benchmark dies (Linux), so nothing leaks."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    """A process in its own session (Ctrl-C reaches only us; we stop it), output drained."""

    def __init__(self, name: str, cmd: Sequence[str], *, ready: re.Pattern[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.name, self.cmd, self.ready, self.env = name, list(cmd), ready, env
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.match: re.Match[str] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> Child:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, text=True, env=self.env,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        if self.ready is not None:
            assert self.proc.stdout is not None
            timer = threading.Timer(timeout, self.proc.kill)
            timer.start()
            try:
                for line in self.proc.stdout:
                    self.output.append(line)
                    self.match = self.ready.search(line)
                    if self.match:
                        break
            finally:
                timer.cancel()
            if self.match is None:
                self.stop()
                raise RuntimeError(f"{self.name} did not start:\n{''.join(self.output[-30:])}")
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            del self.output[:-200]

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def child_pids(pid: int) -> list[int]:
    """Direct children of `pid` (nginx workers), from /proc."""
    out: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _tree(pid: int) -> Callable[[], list[int]]:
    return lambda: [pid, *child_pids(pid)]


def cpu_split(pids: Sequence[int]) -> tuple[float, float]:
    """(utime, stime) of the processes (all their threads), in seconds."""
    user = system = 0
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        user += int(fields[11])  # field 14 of proc(5)
        system += int(fields[12])  # field 15
    return user / CLK_TCK, system / CLK_TCK


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of the processes (all their threads), in seconds."""
    return sum(cpu_split(pids))


def rss_bytes(pids: Sequence[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def self_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_nginx() -> str | None:
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx")
         if os.access(p, os.X_OK)), None)


NGINX_CONF = """\
worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
{user}
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream pacer {{
        server 127.0.0.1:{upstream};
        keepalive 1024;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
    }}
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        ssl_protocols TLSv1.2 TLSv1.3;
        keepalive_requests 1000000;
        keepalive_timeout 300s;
        location / {{
            proxy_pass http://pacer;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 300s;
        }}
    }}
}}
"""


@dataclass
class Target:
    name: str
    port: int
    tls: ssl.SSLContext | None
    auth: bytes  # extra request header lines
    pids: Callable[[], list[int]]  # the processes whose CPU and memory are the target's cost


class Stack:
    """Pacer, gateway and (when installed) nginx on loopback; everything stopped on exit."""

    def __init__(self, *, nginx: bool = True, workdir: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory(prefix="specrouter-overhead-")
        self.dir = workdir or Path(self._tmp.name)
        self.want_nginx = nginx
        self.children: list[Child] = []
        self.targets: dict[str, Target] = {}
        self.pacer: Child | None = None
        self.gateway: Child | None = None
        self.nginx: Child | None = None
        self.nginx_skipped = ""
        self.certs: CertFiles | None = None

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop()
        self.children.clear()
        self._tmp.cleanup()

    def _spawn(self, child: Child) -> Child:
        self.children.append(child)
        return child.start()

    def _start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.certs = certs = make_local_ca(self.dir / "tls")
        client_tls = ssl.create_default_context(cafile=str(certs.ca_cert))
        self.pacer = self._spawn(Child(
            "pacer", [sys.executable, "-m", "loadtests.bench.pacer", "--port", "0"],
            ready=re.compile(r"pacer listening on http://127\.0\.0\.1:(\d+)"), env=env))
        assert self.pacer.match is not None
        pacer_port = int(self.pacer.match.group(1))
        pacer_pid = self.pacer.pid
        self.targets["direct"] = Target("direct", pacer_port, None, b"", lambda: [pacer_pid])

        policy = {
            "schema": 1,
            "backends": {MODEL: {"url": f"http://127.0.0.1:{pacer_port}", "kind": "vllm",
                                 "task": "generate", "served_model_name": MODEL,
                                 "max_concurrency": 4096}},
            "routes": {"bench": {"models": [MODEL], "task": "generate", "variants": [MODEL],
                                 "defaults": {}}},
            "clients": [{"name": "bench", "key_sha256": auth.hash_key(BENCH_KEY)}],
        }
        policy_path = self.dir / "policy.yaml"
        policy_path.write_text(yaml.safe_dump(policy, sort_keys=False))
        self.gateway = self._spawn(Child(
            "gateway", [sys.executable, "-m", "proxy.cli", "serve", "--config", str(policy_path),
                        "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
                        "--tls-cert", str(certs.cert), "--tls-key", str(certs.key),
                        "--admin-token", ADMIN_TOKEN, "--state-dir", str(self.dir / "state")],
            ready=re.compile(r"specrouter listening on https://127\.0\.0\.1:(\d+) admin"),
            env=env))
        assert self.gateway.match is not None
        gw_pid = self.gateway.pid
        bearer = b"authorization: Bearer " + BENCH_KEY.encode() + b"\r\n"
        self.targets["gateway"] = Target("gateway", int(self.gateway.match.group(1)), client_tls,
                                         bearer, lambda: [gw_pid])
        if self.want_nginx:
            self._start_nginx(pacer_port, certs, client_tls, bearer)

    def _start_nginx(self, pacer_port: int, certs: CertFiles, client_tls: ssl.SSLContext,
                     bearer: bytes) -> None:
        binary = find_nginx()
        if binary is None:
            self.nginx_skipped = "no nginx binary (apt-get install nginx-light to compare)"
            return
        d = self.dir / "nginx"
        d.mkdir(exist_ok=True)
        for attempt in range(5):
            port = free_port()
            user = "user root;" if os.geteuid() == 0 else ""
            (d / "nginx.conf").write_text(NGINX_CONF.format(
                d=d, user=user, upstream=pacer_port, port=port, cert=certs.cert, key=certs.key))
            child = Child("nginx", [binary, "-p", str(d), "-c", str(d / "nginx.conf")])
            self.children.append(child)
            child.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and child.alive():
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port),
                                                                           timeout=0.5):
                    break
                time.sleep(0.05)
            if child.alive():
                master = child.pid
                self.nginx = child
                self.targets["nginx"] = Target("nginx", port, client_tls, bearer,
                                               _tree(master))
                return
            self.children.remove(child)
            if attempt == 4:
                self.nginx_skipped = "nginx did not start: " + "".join(child.output[-5:])


# --------------------------------------------------------------------------- load client


@dataclass(slots=True)
class Shot:
    """One request as the client saw it; times are perf_counter seconds."""

    t_sent: float
    t_first: float | None = None  # first complete SSE event
    frames: int = 0  # complete SSE events, [DONE] included
    times: list[float] | None = None  # arrival time of each event, when recorded
    status: int = 0
    ok: bool = False


class Tally:
    __slots__ = ("frames",)

    def __init__(self) -> None:
        self.frames = 0


class ClientConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; counts SSE events as their `\\n\\n` arrives."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.shot: Shot | None = None
        self.fut: asyncio.Future[Shot] | None = None
        self.alive = False
        self.keep = True
        self.now = 0.0
        self._nl = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.alive = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.alive = False
        if self.fut is not None and not self.fut.done():
            self.fut.set_exception(ConnectionError("connection lost mid-response"))

    def data_received(self, data: bytes) -> None:
        self.now = time.perf_counter()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if self.fut is not None and not self.fut.done():
                self.fut.set_exception(ConnectionError(f"bad response: {exc}"))
            self.abort()

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"connection" and value.lower() == b"close":
            self.keep = False

    def on_headers_complete(self) -> None:
        if self.shot is not None:
            self.shot.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        n = body.count(b"\n\n")
        if self._nl and body[:1] == b"\n":
            n += 1
        self._nl = body[-1:] == b"\n" and body[-2:] != b"\n\n"
        shot = self.shot
        if n and shot is not None:
            if shot.frames == 0:
                shot.t_first = self.now
            shot.frames += n
            self.tally.frames += n
            if shot.times is not None:
                shot.times.extend([self.now] * n)

    def on_message_complete(self) -> None:
        shot, fut = self.shot, self.fut
        if shot is not None and fut is not None and not fut.done():
            shot.ok = shot.status == 200
            fut.set_result(shot)
        if not self.keep and self.transport is not None:
            self.transport.close()

    def request(self, payload: bytes, *, record_times: bool) -> asyncio.Future[Shot]:
        assert self.transport is not None
        self.fut = asyncio.get_running_loop().create_future()
        self._nl = False
        self.shot = Shot(time.perf_counter(), times=[] if record_times else None)
        self.transport.write(payload)
        return self.fut

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        self.alive = False


class Pool:
    """The client's connections to one target, opened (and TLS-handshaken) before a round."""

    def __init__(self, target: Target, tally: Tally) -> None:
        self.target = target
        self.tally = tally
        self.conns: list[ClientConn] = []

    async def _open(self) -> ClientConn:
        loop = asyncio.get_running_loop()
        t = self.target
        _, proto = await loop.create_connection(
            lambda: ClientConn(self.tally), "127.0.0.1", t.port, ssl=t.tls,
            server_hostname="127.0.0.1" if t.tls is not None else None)
        return proto

    async def ensure(self, n: int) -> list[ClientConn]:
        self.conns = [c for c in self.conns if c.alive and c.keep]
        async with asyncio.timeout(60):
            while len(self.conns) < n:
                batch = min(32, n - len(self.conns))
                self.conns += await asyncio.gather(*(self._open() for _ in range(batch)))
        return self.conns[:n]

    def abort(self) -> None:
        for conn in self.conns:
            conn.abort()
        self.conns = []


def request_bytes(target: Target, *, max_tokens: int, step_ms: float, prompt_bytes: int,
                  tokens_per_chunk: int = 1) -> bytes:
    system = "You are a coding agent. " * max(1, prompt_bytes // 24)
    body = orjson.dumps({
        "model": MODEL,
        "messages": [{"role": "system", "content": system[:prompt_bytes]},
                     {"role": "user", "content": "Refactor the relay loop."}],
        "stream": True,
        "max_tokens": max_tokens,
        "vllm_xargs": {"pacer_step_ms": step_ms, "pacer_tokens_per_chunk": tokens_per_chunk},
    })
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
            b"content-type: application/json\r\naccept: text/event-stream\r\n" % target.port +
            target.auth + b"content-length: %d\r\n\r\n" % len(body))
    return head + body


# --------------------------------------------------------------------------- rounds


@dataclass(frozen=True)
class Spec:
    kind: str  # ttft1 | paced16 | sat | rss256
    streams: int
    step_ms: float
    max_tokens: int
    duration_s: float  # arrivals window (closed loop), measuring window (sat), hold (rss)
    spread_s: float  # arrivals: exponential gaps with mean spread/streams
    think_s: tuple[float, float] = (0.0, 0.0)
    warmup_s: float = 0.0


@dataclass
class RoundResult:
    target: str
    kind: str
    repeat: int
    ok: bool = True
    error: str = ""
    requests: int = 0
    failed: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    ttft_p50_ms: float | None = None
    gap_p99_ms: float | None = None
    cpu_s: float | None = None
    cpu_per_chunk_us: float | None = None
    cpu_pct: float | None = None
    pacer_cpu_pct: float | None = None
    client_cpu_pct: float | None = None
    rate: float | None = None
    rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def pct(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100), linear between closest ranks."""
    if not values:
        return None
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def arrivals(rng: random.Random, n: int, spread: float) -> list[float]:
    """Staggered start offsets: a Poisson process of n arrivals, about `spread` long."""
    if n <= 1 or spread <= 0:
        return [0.0] * n
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(n / spread)
    return out


class Bench:
    def __init__(self, stack: Stack, *, prompt_bytes: int = 4096) -> None:
        self.stack = stack
        self.tally = Tally()
        self.pools = {name: Pool(t, self.tally) for name, t in stack.targets.items()}
        self.prompt_bytes = prompt_bytes
        assert stack.pacer is not None
        self.pacer_pid = stack.pacer.pid

    def close(self) -> None:
        for pool in self.pools.values():
            pool.abort()

    def _payload(self, target: Target, spec: Spec, max_tokens: int | None = None) -> bytes:
        return request_bytes(target, max_tokens=max_tokens or spec.max_tokens,
                             step_ms=spec.step_ms, prompt_bytes=self.prompt_bytes)

    def _sample(self, pids: list[int]) -> CpuSample:
        (user, system), pacer = cpu_split(pids), cpu_seconds([self.pacer_pid])
        return CpuSample(user, system, pacer, self_cpu(), time.perf_counter())

    async def closed_loop(self, name: str, spec: Spec, repeat: int, seed: int) -> RoundResult:
        """Each stream: arrive, request, read to the end, think, repeat until the window ends."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = self._payload(target, spec)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        shots: list[Shot] = []
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02
        deadline = start + spec.duration_s
        record = spec.kind == "paced16"

        async def stream(i: int, conn: ClientConn) -> None:
            rng = random.Random(seed * 7919 + i)
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            while loop.time() < deadline:
                shots.append(await conn.request(payload, record_times=record))
                await asyncio.sleep(rng.uniform(*spec.think_s))

        pids = target.pids() if name != "direct" else []
        before = self._sample(pids)
        longest = spec.max_tokens * spec.step_ms / 1000.0 + spec.spread_s
        try:
            async with asyncio.timeout(spec.duration_s + longest + 20):
                errors = [e for e in await asyncio.gather(
                    *(stream(i, c) for i, c in enumerate(conns)), return_exceptions=True)
                    if isinstance(e, BaseException)]
            if errors:
                raise errors[0]
        except (TimeoutError, ConnectionError, OSError) as exc:
            res.ok, res.error = False, f"{type(exc).__name__}: {exc}"
            pool.abort()
        after = self._sample(pids)
        expected = spec.max_tokens + 2  # role, one event per token (1 token/chunk), [DONE]
        good = [s for s in shots if s.ok and s.frames == expected and s.t_first is not None]
        res.requests, res.failed = len(shots), len(shots) - len(good)
        if res.failed:
            res.ok = False
            res.error = res.error or f"{res.failed} of {len(shots)} responses incomplete"
        res.chunks = sum(s.frames - 1 for s in good)
        ttfts = [(s.t_first - s.t_sent) * 1000 for s in good if s.t_first is not None]
        res.ttft_p50_ms = pct(ttfts, 50)
        if record:
            gaps: list[float] = []
            for s in good:
                if s.times is not None:
                    t = s.times[1:-1]  # decode events: first token's to the last one
                    gaps += [(b - a) * 1000 for a, b in zip(t, t[1:], strict=False)]
            res.gap_p99_ms = pct(gaps, 99)
            res.extra["gaps"] = len(gaps)
            res.extra["gap_p50_ms"] = pct(gaps, 50)
        res.extra["ttft_samples"] = len(ttfts)
        _account(res, before, after, bool(pids))
        if pids and good and res.cpu_s is not None:
            res.extra["cpu_per_request_ms"] = res.cpu_s / len(good) * 1000
        return res

    async def saturate(self, name: str, spec: Spec, repeat: int, seed: int) -> RoundResult:
        """Streams as fast as the target relays them; rate and CPU over a fixed window."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = self._payload(target, spec, max_tokens=10_000_000)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02

        async def stream(i: int, conn: ClientConn) -> Shot:
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            return await conn.request(payload, record_times=False)

        tasks = [asyncio.ensure_future(stream(i, c)) for i, c in enumerate(conns)]
        pids = target.pids() if name != "direct" else []
        try:
            await asyncio.sleep(spec.spread_s + spec.warmup_s)
            f0, before = self.tally.frames, self._sample(pids)
            await asyncio.sleep(spec.duration_s)
            f1, after = self.tally.frames, self._sample(pids)
            broken = [t for t in tasks if t.done()]
            if broken:
                res.ok, res.error = False, f"{len(broken)} streams ended during the window"
        finally:
            pool.abort()
            await asyncio.gather(*tasks, return_exceptions=True)
        res.chunks = f1 - f0
        _account(res, before, after, bool(pids))
        res.rate = res.chunks / res.wall_s
        await asyncio.sleep(0.3)  # let the proxy and the pacer wind the dropped streams down
        return res

    async def hold_open(self, name: str, spec: Spec, repeat: int, seed: int) -> RoundResult:
        """`spec.streams` streams open at once; the proxy's resident memory while they stream."""
        pool, target = self.pools[name], self.stack.targets[name]
        res = RoundResult(name, spec.kind, repeat)
        conns = await pool.ensure(spec.streams)
        payload = self._payload(target, spec, max_tokens=10_000_000)
        offsets = arrivals(random.Random(seed), spec.streams, spec.spread_s)
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.02
        shots: list[Shot] = []

        async def stream(i: int, conn: ClientConn) -> Shot:
            await asyncio.sleep(max(0.0, start + offsets[i] - loop.time()))
            fut = conn.request(payload, record_times=False)
            assert conn.shot is not None
            shots.append(conn.shot)
            return await fut

        tasks = [asyncio.ensure_future(stream(i, c)) for i, c in enumerate(conns)]
        pids = target.pids()
        rss_before = rss_bytes(pids)
        samples: list[int] = []
        try:
            async with asyncio.timeout(spec.spread_s + 30):
                while len(shots) < spec.streams or any(s.t_first is None for s in shots):
                    if any(t.done() for t in tasks):
                        break
                    await asyncio.sleep(0.05)
            res.extra["open"] = sum(1 for s in shots if s.t_first is not None)
            end = loop.time() + spec.duration_s
            while loop.time() < end:
                samples.append(rss_bytes(pids))
                await asyncio.sleep(0.1)
            if any(t.done() for t in tasks):
                res.ok, res.error = False, "some streams ended while held open"
        except TimeoutError:
            res.ok, res.error = False, "streams did not all start"
        finally:
            pool.abort()
            await asyncio.gather(*tasks, return_exceptions=True)
        res.rss_mb = max(samples) / 1e6 if samples else None
        res.extra["rss_before_mb"] = rss_before / 1e6
        await asyncio.sleep(0.5)
        return res


# --------------------------------------------------------------------------- plan and report


@dataclass(frozen=True)
class Plan:
    repeats: int
    rss_repeats: int
    ttft1: Spec
    paced16: Spec
    sat: Spec
    rss256: Spec


def make_plan(quick: bool, repeats: int | None, paced_tokens: int = 48) -> Plan:
    if quick:
        return Plan(
            repeats=repeats or 2, rss_repeats=1,
            ttft1=Spec("ttft1", 1, 5.0, 4, 1.0, 0.0, (0.005, 0.015)),
            paced16=Spec("paced16", 16, 30.0, paced_tokens, 3.0, 0.5, (0.02, 0.2)),
            sat=Spec("sat", 16, 0.0, 0, 1.5, 0.1, warmup_s=0.4),
            rss256=Spec("rss256", 256, 100.0, 0, 1.0, 1.0))
    return Plan(
        repeats=repeats or 5, rss_repeats=2,
        ttft1=Spec("ttft1", 1, 5.0, 4, 2.0, 0.0, (0.005, 0.015)),
        paced16=Spec("paced16", 16, 30.0, paced_tokens, 5.0, 0.5, (0.02, 0.2)),
        sat=Spec("sat", 16, 0.0, 0, 3.0, 0.1, warmup_s=0.5),
        rss256=Spec("rss256", 256, 100.0, 0, 1.5, 1.0))


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _short(r: RoundResult) -> str:
    parts = [f"{r.kind:<8} {r.target:<8}"]
    if r.ttft_p50_ms is not None:
        parts.append(f"ttft50={r.ttft_p50_ms:.2f}ms")
    if r.gap_p99_ms is not None:
        parts.append(f"gap99={r.gap_p99_ms:.2f}ms")
    if r.rate is not None:
        parts.append(f"rate={r.rate:,.0f}/s")
    if r.kind == "ttft1" and "cpu_per_request_ms" in r.extra:
        parts.append(f"cpu={r.extra['cpu_per_request_ms']:.2f}ms/request")
    elif r.cpu_per_chunk_us is not None:
        parts.append(f"cpu={r.cpu_per_chunk_us:.1f}us/chunk "
                     f"(user {r.extra.get('user_us_per_chunk', 0):.1f} "
                     f"sys {r.extra.get('sys_us_per_chunk', 0):.1f}; {r.cpu_pct:.0f}%)")
    if r.rss_mb is not None:
        parts.append(f"rss={r.rss_mb:.1f}MB")
    if r.requests:
        parts.append(f"req={r.requests}")
    parts.append(f"pacer={r.pacer_cpu_pct or 0:.0f}% client={r.client_cpu_pct or 0:.0f}%")
    if not r.ok:
        parts.append(f"FAILED: {r.error}")
    return "  " + " ".join(parts)


async def run_plan(bench: Bench, plan: Plan, *, kinds: Sequence[str]) -> list[RoundResult]:
    names = [n for n in TARGETS if n in bench.stack.targets]
    results: list[RoundResult] = []
    warm = Spec("warmup", 16, 1.0, 8, 0.5, 0.1, (0.0, 0.01))
    for name in names:  # open the proxies' upstream pools, page everything in
        await bench.closed_loop(name, warm, -1, 1)
    proxies = [n for n in names if n != "direct"]
    for name in proxies:
        results.append(RoundResult(name, "rss_idle", -1,
                                   rss_mb=rss_bytes(bench.stack.targets[name].pids()) / 1e6))
    if "rss256" in kinds:
        # First, before the long unpaced streams of `sat` leave their traces in the heap
        # (the figure for those is `rss_end`, at the end of the run).
        for r in range(plan.rss_repeats):
            for name in proxies[r % len(proxies):] + proxies[: r % len(proxies)]:
                res = await bench.hold_open(name, plan.rss256, r, 5000 + r)
                results.append(res)
                log(_short(res))
    for r in range(plan.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        log(f"repeat {r + 1}/{plan.repeats} (order {' / '.join(order)})")
        for spec in (plan.ttft1, plan.paced16, plan.sat):
            if spec.kind not in kinds:
                continue
            seed = 1000 * r + len(spec.kind)
            for name in order:
                if spec.kind == "sat":
                    res = await bench.saturate(name, spec, r, seed)
                else:
                    res = await bench.closed_loop(name, spec, r, seed)
                results.append(res)
                log(_short(res))
    await asyncio.sleep(1.0)
    for name in proxies:
        results.append(RoundResult(name, "rss_end", -1,
                                   rss_mb=rss_bytes(bench.stack.targets[name].pids()) / 1e6))
    return results


@dataclass
class Figure:
    values: list[float]
    runs: int  # rounds that produced a value

    def cell(self, fmt: str) -> str:
        if not self.values:
            return "n/a"
        med = pct(self.values, 50)
        assert med is not None
        lo, hi = min(self.values), max(self.values)
        return f"{med:{fmt}} ({lo:{fmt}}–{hi:{fmt}}, n={self.runs})"

    @property
    def median(self) -> float | None:
        return pct(self.values, 50)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: the proxy's (user, system), the pacer's, this client's; and the clock."""

    user: float
    system: float
    pacer: float
    client: float
    wall: float


def _account(res: RoundResult, before: CpuSample, after: CpuSample, proxy: bool) -> None:
    """A round's CPU figures from two samples; per chunk once `res.chunks` is set."""
    res.wall_s = after.wall - before.wall
    cpu = (after.user + after.system) - (before.user + before.system)
    if proxy and res.chunks:
        res.cpu_s = cpu
        res.cpu_per_chunk_us = cpu / res.chunks * 1e6
        res.cpu_pct = cpu / res.wall_s * 100
        res.extra["user_us_per_chunk"] = (after.user - before.user) / res.chunks * 1e6
        res.extra["sys_us_per_chunk"] = (after.system - before.system) / res.chunks * 1e6
    res.pacer_cpu_pct = (after.pacer - before.pacer) / res.wall_s * 100
    res.client_cpu_pct = (after.client - before.client) / res.wall_s * 100


def summarize(results: list[RoundResult], targets: Sequence[str]) -> dict[str, dict[str, Figure]]:
    """metric -> target -> Figure. Added figures pair each round with the same repeat's direct."""
    by: dict[tuple[str, str, int], RoundResult] = {}
    for r in results:
        if r.ok:
            by[(r.kind, r.target, r.repeat)] = r
    repeats = sorted({r.repeat for r in results})
    out: dict[str, dict[str, Figure]] = {}

    def added(metric: str, kind: str, attr: str) -> None:
        out[metric] = {}
        for t in targets:
            vals = []
            for rep in repeats:
                a, d = by.get((kind, t, rep)), by.get((kind, "direct", rep))
                if a is None or d is None:
                    continue
                av, dv = getattr(a, attr), getattr(d, attr)
                if av is not None and dv is not None:
                    vals.append(av - dv if t != "direct" else av)
            out[metric][t] = Figure(vals, len(vals))

    def plain(metric: str, kind: str, attr: str, scale: float = 1.0) -> None:
        out[metric] = {}
        for t in targets:
            vals = [getattr(r, attr) * scale for (k, tt, _), r in by.items()
                    if k == kind and tt == t and getattr(r, attr) is not None]
            out[metric][t] = Figure(vals, len(vals))

    added("ttft1_added_ms", "ttft1", "ttft_p50_ms")
    added("ttft16_added_ms", "paced16", "ttft_p50_ms")
    added("gap99_added_ms", "paced16", "gap_p99_ms")
    plain("cpu_paced_us", "paced16", "cpu_per_chunk_us")
    plain("cpu_sat_us", "sat", "cpu_per_chunk_us")
    plain("sat_rate", "sat", "rate")
    plain("rss256_mb", "rss256", "rss_mb")
    plain("rss_idle_mb", "rss_idle", "rss_mb")
    plain("rss_end_mb", "rss_end", "rss_mb")
    plain("cpu_pct_sat", "sat", "cpu_pct")
    return out


def paced_cpu_ratio(results: list[RoundResult]) -> Figure:
    """Gateway over nginx CPU per paced chunk, each repeat against its own nginx round."""
    cpu = {(r.target, r.repeat): r.cpu_per_chunk_us for r in results
           if r.ok and r.kind == "paced16" and r.cpu_per_chunk_us}
    vals = [g / n for (t, rep), g in cpu.items()
            if t == "gateway" and g is not None and (n := cpu.get(("nginx", rep)))]
    return Figure(vals, len(vals))


ROWS: list[tuple[str, str, str]] = [
    ("ttft1_added_ms", "added TTFT p50, 1 stream (ms)", ".2f"),
    ("ttft16_added_ms", "added TTFT p50, 16 streams (ms)", ".2f"),
    ("gap99_added_ms", "added gap p99, 16 streams/30 ms (ms)", ".2f"),
    ("cpu_paced_us", "CPU per chunk, 16 paced streams (µs)", ".1f"),
    ("cpu_sat_us", "CPU per chunk, saturated (µs)", ".1f"),
    ("sat_rate", "saturation rate (chunks/s)", ",.0f"),
    ("cpu_pct_sat", "proxy CPU while saturated (% of a core)", ".0f"),
    ("rss256_mb", "RSS at 256 open streams (MB)", ".1f"),
    ("rss_idle_mb", "RSS idle, after warm-up (MB)", ".1f"),
    ("rss_end_mb", "RSS at the end of the run (MB)", ".1f"),
]


def render(summary: dict[str, dict[str, Figure]], targets: Sequence[str],
           results: list[RoundResult]) -> str:
    cols = [t for t in ("gateway", "nginx") if t in targets]
    header = ["metric", *cols, "target", "gateway meets"]
    lines: list[list[str]] = []
    for key, label, fmt in ROWS:
        row = [label]
        for t in cols:
            row.append(summary[key][t].cell(fmt))
        goal = GOALS.get(key)
        if goal is None:
            row += ["—", ""]
        else:
            op, bound = goal
            row.append(f"{op} {bound:g}")
            med = summary[key]["gateway"].median if "gateway" in summary[key] else None
            if med is None:
                row.append("n/a")
            else:
                row.append("yes" if (med <= bound if op == "<=" else med < bound) else "NO")
        lines.append(row)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def fmt_row(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    out = [fmt_row(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt_row(r) for r in lines]
    base: list[str] = []
    direct = {k: [r for r in results if r.target == "direct" and r.kind == k and r.ok]
              for k in ("ttft1", "paced16", "sat")}
    for label, kind, attr, unit in (("TTFT p50 1 stream", "ttft1", "ttft_p50_ms", "ms"),
                                    ("TTFT p50 16 streams", "paced16", "ttft_p50_ms", "ms"),
                                    ("gap p99 16 streams", "paced16", "gap_p99_ms", "ms"),
                                    ("rate", "sat", "rate", "chunks/s")):
        vals = [getattr(r, attr) for r in direct[kind] if getattr(r, attr) is not None]
        med = pct(vals, 50)
        if med is not None:
            base.append(f"{label} {med:,.0f} {unit}" if unit == "chunks/s" else
                        f"{label} {med:.2f} {unit}")
    if base:
        out.append("direct (the pacer, no proxy), medians: " + "; ".join(base))
    ratio = paced_cpu_ratio(results)
    if ratio.values:
        # A shared machine's speed moves between runs, nginx's figure with it: the ratio of
        # the two within one repeat tells what the gateway adds on that machine, that moment.
        out.append(f"gateway / nginx CPU per paced chunk, per repeat: {ratio.cell('.2f')}")
    failed = [r for r in results if not r.ok]
    if failed:
        out.append(f"{len(failed)} round(s) failed and are left out: " +
                   "; ".join(f"{r.kind}/{r.target}#{r.repeat}: {r.error}" for r in failed[:6]))
    return "\n".join(out)


def describe(plan: Plan, prompt_bytes: int) -> str:
    p, s, m = plan.paced16, plan.sat, plan.rss256
    return (f"rounds: ttft1 = 1 stream, {plan.ttft1.max_tokens}-token responses, "
            f"{plan.ttft1.duration_s:g} s; paced16 = 16 streams, {p.step_ms:g} ms step, "
            f"{p.max_tokens}-token responses, {p.duration_s:g} s of arrivals; sat = "
            f"{s.streams} streams unpaced, {s.duration_s:g} s window; rss256 = {m.streams} "
            f"streams at {m.step_ms:g} ms; {plan.repeats} repeats ({plan.rss_repeats} for "
            f"rss256); 1 token per chunk; request body ~{prompt_bytes} B; client on uvloop, "
            f"keep-alive, TLS 1.3 to the proxies")


# --------------------------------------------------------------------------- main


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.overhead", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter rounds, 2 repeats (~1 min)")
    ap.add_argument("--repeats", type=int, help="repeats of the alternating rounds")
    ap.add_argument("--json", type=Path, help="write every round and the summary here")
    ap.add_argument("--no-nginx", action="store_true", help="skip the nginx comparison")
    ap.add_argument("--only", default="ttft1,paced16,sat,rss256",
                    help="comma-separated rounds to run (default: all)")
    ap.add_argument("--prompt-bytes", type=int, default=4096, help="request body size, roughly")
    ap.add_argument("--paced-tokens", type=int, default=48,
                    help="chunks per paced response (48; an agent's ~460-token answer at ~4 "
                         "tokens a step is ~115): the request's own CPU is spread over them")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]
    plan = make_plan(args.quick, args.repeats, args.paced_tokens)
    signal.signal(signal.SIGTERM, _interrupt)
    t_start = time.monotonic()
    try:
        with Stack(nginx=not args.no_nginx) as stack:
            names = [n for n in TARGETS if n in stack.targets]
            log(f"pacer pid {stack.pacer.pid if stack.pacer else '?'}, gateway pid "
                f"{stack.gateway.pid if stack.gateway else '?'}"
                + (f", nginx pid {stack.nginx.pid}" if stack.nginx else "")
                + (f"; nginx skipped: {stack.nginx_skipped}" if stack.nginx_skipped else ""))
            log(describe(plan, args.prompt_bytes))

            async def go() -> list[RoundResult]:
                bench = Bench(stack, prompt_bytes=args.prompt_bytes)
                try:
                    return await run_plan(bench, plan, kinds=kinds)
                finally:
                    bench.close()

            results: list[RoundResult] = _run(go())
            for child in stack.children:
                if not child.alive():
                    log(f"{child.name} exited during the run:\n{''.join(child.output[-20:])}")
    except KeyboardInterrupt:
        log("interrupted: everything started was stopped")
        return 130
    summary = summarize(results, names)
    print(f"\ngateway overhead on {os.cpu_count()} CPUs, {time.monotonic() - t_start:.0f} s "
          f"({'quick' if args.quick else 'full'} run); median (min–max, n = runs)")
    print(describe(plan, args.prompt_bytes))
    if stack.nginx_skipped:
        print(f"nginx column skipped: {stack.nginx_skipped}")
    print(render(summary, names, results))
    if args.json:
        doc = {
            "plan": describe(plan, args.prompt_bytes),
            "quick": args.quick,
            "targets": names,
            "goals": GOALS,
            "summary": {k: {t: {"median": f.median, "values": f.values, "runs": f.runs}
                            for t, f in v.items()} for k, v in summary.items()},
            "cpu_paced_ratio_to_nginx": paced_cpu_ratio(results).values,
            "rounds": [r.__dict__ for r in results],
        }
        args.json.write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    return 0


def iter_frames(body: bytes) -> Iterator[bytes]:
    """SSE events of a body, each with its `\\n\\n` (for tests and checks)."""
    for part in body.split(b"\n\n"):
        if part:
            yield part + b"\n\n"


if __name__ == "__main__":
    sys.exit(main())
