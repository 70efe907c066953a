"""One agent-sized request through the gateway's request path, profiled in one process.

    python -m loadtests.bench.overhead.profile_request            # CPU per request, per body
    python -m loadtests.bench.overhead.profile_request --cprofile # and the top functions

The gateway's public app (proxy/relay/app.py) is called as ASGI, in this process, against the
pacer (a child process): the body handed over in 64 KiB messages as uvicorn does, the answer
relayed by the push relay (as `specrouter serve` relays streams: a kept engine connection, the
body's pieces written with one `writelines`) to a client transport that drops it; `--pull`
relays by the pull relay (aiohttp, a connection per request: non-streamed answers) instead. What is timed is the request path (read, parse, checks,
session, decision, upstream body, relay, measurement, log row), not TLS or HTTP parsing. CPU
time of this process (`time.process_time`) per request, median of `--rounds` rounds of
`--requests` requests each; on a shared machine read the spread, and compare one-line with
agent-sized bodies within one run. `--steps` adds each step's CPU per request, timed where it
runs in the live path (steps.py). `--cprofile` times functions by CPU time too (not wall
time: the machine's other work, and the waits on the pacer, are not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import functools
import io
import pstats
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import yaml

from loadtests.bench.agent_body import Api, agent_body, one_line
from loadtests.bench.overhead.stack import BENCH_KEY, MODEL, bench_policy
from loadtests.bench.overhead.steps import StepClock, report
from loadtests.harness.launch import Child
from policies.compiled import compile_policy
from policies.schema import load_policy
from proxy.gateway import Gateway
from proxy.memory import tune_allocator
from proxy.relay.app import PublicApp
from proxy.relay.channel import PushChannel
from proxy.settings import Settings

PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CHUNK = 65536


class _Dropped:
    """The client's side of the push relay: a transport that takes every byte and drops it."""

    write_paused = False

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass

    async def drain(self) -> None:
        pass


class _Protocol:
    """What `PushChannel` reads of our server's protocol (proxy/servers.py)."""

    def __init__(self) -> None:
        self.transport = self.flow = _Dropped()
        self.cycle = self
        self.disconnected = False
        self.on_lost: Any = None


def _gateway(pacer_port: int, workdir: Path) -> Gateway:
    policy = bench_policy(pacer_port)
    config = workdir / "policy.yaml"
    config.write_text(yaml.safe_dump(policy, sort_keys=False))
    settings = Settings.model_validate(
        {"config": config, "state_dir": workdir / "state", "admin_token": ["x" * 32]}
    )
    return Gateway(settings, compile_policy(load_policy(config)))


def body_of(api: Api, size: int) -> bytes:
    body = one_line(api, model=MODEL) if size == 0 else agent_body(api, size, model=MODEL)
    body["max_output_tokens" if api == "responses" else "max_tokens"] = 10
    body["vllm_xargs"] = {"pacer_step_ms": 0, "pacer_tokens_per_chunk": 1}
    return orjson.dumps(body)


@functools.lru_cache(maxsize=16)
def _pieces(raw: bytes) -> list[bytes]:
    """The body as uvicorn hands it over, cut once (the harness's copies are not the gateway's)."""
    return [raw[i : i + CHUNK] for i in range(0, len(raw), CHUNK)] or [b""]


async def one(app: PublicApp, path: str, raw: bytes, push: bool = True) -> int:
    protocol = _Protocol()
    scope: dict[str, Any] = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": [
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer " + BENCH_KEY.encode()),
            (b"content-length", str(len(raw)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "extensions": {"specrouter.push": PushChannel(protocol)} if push else {},
    }
    pieces = _pieces(raw)
    sent = 0
    done = asyncio.Event()
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent < len(pieces):
            sent += 1
            return {
                "type": "http.request",
                "body": pieces[sent - 1],
                "more_body": sent < len(pieces),
            }
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            done.set()

    await app(scope, receive, send)
    del protocol  # held until the answer ends, as the connection holds it
    done.set()
    return status


async def run(args: argparse.Namespace, port: int, workdir: Path) -> None:
    tune_allocator()  # as `specrouter serve` does (proxy/memory.py)
    gw = _gateway(port, workdir)
    app = PublicApp(gw)
    bodies = {
        f"{api}/{size // 1024}K" if size else f"{api}/1line": (PATHS[api], body_of(api, size))
        for api in args.apis.split(",")
        for size in (0, args.size)
    }
    for path, raw in bodies.values():  # warm up: pools, caches, lazy imports
        for _ in range(20):
            assert await one(app, path, raw, not args.pull) == 200
    per: dict[str, list[float]] = {k: [] for k in bodies}
    prof = cProfile.Profile(time.process_time) if args.cprofile else None
    clock = StepClock() if args.steps else None
    if clock is not None:
        clock.install()
    spent: dict[str, dict[str, float]] = {k: {} for k in bodies}
    for _ in range(args.rounds):
        for name, (path, raw) in bodies.items():
            if prof is not None and name.endswith("K"):
                prof.enable()
            c0 = time.process_time()

            async def loop(path: str = path, raw: bytes = raw) -> None:
                for _ in range(args.requests // args.concurrency):
                    await one(app, path, raw, not args.pull)

            await asyncio.gather(*(loop() for _ in range(args.concurrency)))
            per[name].append((time.process_time() - c0) / args.requests * 1000)
            if prof is not None:
                prof.disable()
            if clock is not None:
                for label, secs in clock.take().items():
                    spent[name][label] = spent[name].get(label, 0.0) + secs
    if clock is not None:
        clock.uninstall()
    for name, vals in per.items():
        print(
            f"{name:<16} {len(bodies[name][1]) / 1024:7.1f} KiB  CPU per request "
            f"{statistics.median(vals):.3f} ms ({min(vals):.3f}-{max(vals):.3f}, "
            f"{args.rounds} rounds of {args.requests})"
        )
        if clock is not None:
            print(report(name, spent[name], args.rounds * args.requests))
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(args.sort).print_stats(args.top)
        print(out.getvalue())
    await gw.aclose()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m loadtests.bench.overhead.profile_request")
    ap.add_argument("--apis", default="chat,responses,messages")
    ap.add_argument("--size", type=int, default=406 * 1024, help="the agent body's bytes")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--pull", action="store_true", help="relay by the pull relay, not push")
    ap.add_argument("--cprofile", action="store_true", help="profile the agent-sized requests")
    ap.add_argument("--steps", action="store_true", help="CPU per request of each step (steps.py)")
    ap.add_argument("--sort", default="tottime")
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args(argv)
    pacer = Child(
        "pacer",
        [sys.executable, "-m", "loadtests.bench.pacer", "--port", "0"],
        ready=re.compile(r"pacer listening on http://127\.0\.0\.1:(\d+)"),
        detach=True,
    ).start()
    try:
        assert pacer.match is not None
        with tempfile.TemporaryDirectory(prefix="specrouter-profile-") as tmp:
            asyncio.run(run(args, int(pacer.match.group(1)), Path(tmp)))
    finally:
        pacer.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
