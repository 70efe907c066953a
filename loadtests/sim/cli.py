"""`specrouter sim`: run one simulated vLLM backend.

The socket is bound before uvicorn starts so that `--port 0` gives a known port; once the server
accepts connections the process prints exactly one line, `specrouter-sim listening on
http://HOST:PORT`, which `loadtests/harness/sim.py` and other tools wait for.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from . import colocate
from .asgi import SimulatedCrash
from .profiles import ProfileError, load_profiles
from .server import create_app
from .state import SimConfig

LISTENING = "specrouter-sim listening on http://{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specrouter sim", description="Run a simulated vLLM backend.")
    p.add_argument(
        "--profile", default="dflash7-prob-block", help="profile name (see --list-profiles)"
    )
    p.add_argument(
        "--port", type=int, required=False, default=8000, help="0 binds an ephemeral port"
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies every duration")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--per-request-spec-decode-metrics", choices=("none", "summary"), default="none")
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--faults", action="store_true", help="enable /_sim/faults and /_sim/stats")
    p.add_argument(
        "--profile-file", default=None, help="YAML file with extra or overriding profiles"
    )
    p.add_argument("--api-key", default=None)
    p.add_argument(
        "--embed-dim", type=int, default=None, help="embedding dimension (embed profile)"
    )
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='serve tool_choice "auto" (needs --tool-call-parser)')
    p.add_argument("--tool-call-parser", choices=("qwen3_coder", "hermes"), default=None)
    p.add_argument("--reasoning-parser", choices=("qwen3",), default=None)
    p.add_argument("--list-profiles", action="store_true")
    colocate.add_arguments(p)
    return p


class _DropSimulatedCrashes(logging.Filter):
    """uvicorn logs an app exception at ERROR; a simulated crash is not one."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, SimulatedCrash)


class _Server(uvicorn.Server):
    """Announces itself once it accepts connections; on SIGINT/SIGTERM ends open streams at once
    instead of waiting for them to finish."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None], announce: str) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._announce = announce

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            print(self._announce, flush=True)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self._on_exit()
        super().handle_exit(sig, frame)

    async def _serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super()._serve(sockets)
        # uvicorn re-raises a captured SIGINT/SIGTERM after shutdown (a traceback or a -15
        # exit); a simulator asked to stop has stopped cleanly, so it exits 0 instead.
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def _loop_name() -> str:
    try:
        import uvloop  # noqa: F401
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return "asyncio"
    return "uvloop"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        profiles = load_profiles(args.profile_file)
    except (OSError, ProfileError) as err:
        print(f"specrouter sim: {err}", file=sys.stderr)
        return 2
    if args.list_profiles:
        for name, prof in profiles.items():
            print(f"{name:<20} {prof.description}")
        return 0
    profile = profiles.get(args.profile)
    if profile is None:
        print(
            f"specrouter sim: unknown profile {args.profile!r}; known: {', '.join(profiles)}",
            file=sys.stderr,
        )
        return 2
    if args.time_scale <= 0:
        print("specrouter sim: --time-scale must be > 0", file=sys.stderr)
        return 2

    config = SimConfig(
        profile=profile,
        served_model_name=args.served_model_name or profile.served_model_name,
        time_scale=args.time_scale,
        seed=args.seed,
        spec_metrics=args.per_request_spec_decode_metrics,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        faults=args.faults,
        api_key=args.api_key,
        embed_dim=args.embed_dim,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
    )
    if args.engine:
        return colocate.main(args, profiles, config)
    app, sim = create_app(colocate.single(args, config))

    sock = socket.socket(
        socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM
    )
    # A restarted sim must be able to take its old port back at once (tests restart on purpose).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        print(f"specrouter sim: cannot bind {args.host}:{args.port}: {err}", file=sys.stderr)
        return 2
    sock.listen(2048)
    sock.setblocking(False)
    port = sock.getsockname()[1]

    logging.getLogger("uvicorn.error").addFilter(_DropSimulatedCrashes())
    uv_config = uvicorn.Config(
        app,
        http="httptools",
        loop=_loop_name(),
        access_log=False,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    server = _Server(uv_config, sim.abort_all, LISTENING.format(host=args.host, port=port))
    server.run(sockets=[sock])
    return 0
