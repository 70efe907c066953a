"""Engines that share one GPU: `specrouter sim --engine NAME:PORT:PROFILE[:SHARE]` repeated.

One process serves every engine of the device, each on its own port with its own metrics,
faults and prefix cache, because co-located engines must step on one clock (device.py):
separate processes would need a round trip per step to agree on who uses the GPU. Once every
engine accepts connections the process prints one `specrouter-sim listening on URL engine NAME
...` line per engine, all at once.

Memory: an engine with a SHARE (its --gpu-memory-utilization) gets the KV tokens the memory
model gives that share; the others split what is left of the machine as `deploy render` does
(two embedding engines' shares taken first), each at most `--kv-budget`: `machine` (the
default: what `deploy render` gives the deployed engine of policies/gb10.yaml, the machine's
limit), `documents` (the source documents' 36 GiB) or a number of GiB.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import uvicorn

from proxy.ops.deploy.memory import KV_BUDGETS, MemoryParams, named_budget, parse_budget

from .device import Device, DeviceParams, kv_tokens_from_share, kv_tokens_split
from .profiles import Profile
from .server import create_app
from .state import SimConfig

EMBEDDERS = 2  # the deployment's embedding engines, whose shares come off the top


@dataclass(frozen=True, slots=True)
class EngineSpec:
    name: str
    port: int
    profile: str
    share: float | None


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default="gpu0",
        help="name of the GPU this process simulates (default: %(default)s)",
    )
    p.add_argument(
        "--overlap",
        type=_fraction,
        default=0.0,
        help="0..1: how far co-located engines' steps overlap (default 0: they serialise)",
    )
    p.add_argument(
        "--kv-share",
        type=float,
        default=None,
        help="this engine's --gpu-memory-utilization: KV tokens from the memory model",
    )
    p.add_argument(
        "--kv-budget",
        type=parse_budget,
        default="machine",
        metavar="|".join(KV_BUDGETS) + "|GIB",
        help="KV of an engine without a share: the machine's limit (default), the documents' "
        "36 GiB, or at most GIB",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME:PORT:PROFILE[:SHARE]",
        help="one engine of the device (repeat; replaces --port and --profile)",
    )


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be within 0..1")
    return value


def parse_engine(text: str) -> EngineSpec:
    parts = text.split(":")
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"--engine {text!r}: expected NAME:PORT:PROFILE[:SHARE]")
    share = float(parts[3]) if len(parts) == 4 else None
    if share is not None and not 0.0 < share <= 1.0:
        raise ValueError(f"--engine {text!r}: SHARE must be within (0, 1]")
    return EngineSpec(parts[0], int(parts[1]), parts[2], share)


def kv_tokens(
    specs: list[EngineSpec], profiles: dict[str, Profile], budget: str | float = "machine"
) -> list[int]:
    """Each engine's KV tokens: from its share, else split as `deploy render` does, each at
    most `budget` (a name of KV_BUDGETS or GiB). Embedding engines keep their profile's."""

    def coder(s: EngineSpec) -> bool:
        return profiles[s.profile].kind != "embed"

    unshared = [profiles[s.profile] for s in specs if s.share is None and coder(s)]
    params = MemoryParams(kv_budget_gib=named_budget(budget))
    split = kv_tokens_split(unshared, EMBEDDERS, params) if unshared else []
    out: list[int] = []
    for s in specs:
        if not coder(s):
            out.append(profiles[s.profile].kv_cache_tokens)
        elif s.share is not None:
            out.append(kv_tokens_from_share(profiles[s.profile], s.share))
        else:
            out.append(split.pop(0))
    return out


def single(args: argparse.Namespace, config: SimConfig) -> SimConfig:
    """One engine: its device (for --overlap to mean nothing but a name), --kv-share or
    --kv-budget."""
    device = Device(args.device, DeviceParams(overlap=args.overlap))
    spec = EngineSpec(config.profile.name, 0, config.profile.name, args.kv_share)
    [kv] = kv_tokens([spec], {spec.profile: config.profile}, args.kv_budget)
    return replace(config, device=device, kv_cache_tokens=kv)


class _Group:
    """Stops every engine's server when any of them is asked to stop (one signal handler)."""

    def __init__(self, lines: list[str]) -> None:
        self.servers: list[_Server] = []
        self.lines = lines
        self.started = 0

    def started_one(self) -> None:
        self.started += 1
        if self.started == len(self.servers):
            print("\n".join(self.lines), flush=True)


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, group: _Group, abort: Callable[[], None]) -> None:
        super().__init__(config)
        self._group = group
        self._abort = abort

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self._group.started_one()

    def handle_exit(self, sig: int, frame: object) -> None:
        for server in self._group.servers:
            server._abort()
            server.should_exit = True

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super()._serve(sockets)
        # As cli._Server: a simulator asked to stop exits 0, not with the signal re-raised.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def main(args: argparse.Namespace, profiles: dict[str, Profile], config: SimConfig) -> int:
    try:
        specs = [parse_engine(e) for e in args.engine]
        unknown = [s.profile for s in specs if s.profile not in profiles]
        if unknown:
            raise ValueError(f"unknown profile(s) {', '.join(unknown)}")
        device = Device(args.device, DeviceParams(overlap=args.overlap))
        kvs = kv_tokens(specs, profiles, args.kv_budget)
    except ValueError as err:  # MemorySplitError included
        print(f"specrouter sim: {err}", file=sys.stderr)
        return 2
    lines: list[str] = []
    group = _Group(lines)
    sockets: list[socket.socket] = []
    for spec, kv in zip(specs, kvs, strict=True):
        profile = profiles[spec.profile]
        cfg = replace(
            config,
            profile=profile,
            device=device,
            kv_cache_tokens=kv,
            served_model_name=args.served_model_name or profile.served_model_name,
        )
        app, sim = create_app(cfg)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((args.host, spec.port))
        except OSError as err:
            print(f"specrouter sim: cannot bind {args.host}:{spec.port}: {err}", file=sys.stderr)
            return 2
        sock.listen(2048)
        sock.setblocking(False)
        sockets.append(sock)
        port = sock.getsockname()[1]
        lines.append(
            f"specrouter-sim listening on http://{args.host}:{port} engine {spec.name} "
            f"profile {profile.name} device {device.name} "
            f"kv_tokens {sim.core.kv_capacity}"
        )
        uv = uvicorn.Config(
            app,
            http="httptools",
            access_log=False,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        group.servers.append(_Server(uv, group, sim.abort_all))

    async def serve_all() -> None:
        await asyncio.gather(
            *(s.serve(sockets=[sock]) for s, sock in zip(group.servers, sockets, strict=True))
        )

    asyncio.run(serve_all())
    return 0
