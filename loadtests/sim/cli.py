"""`specrouter sim`: run one simulated vLLM backend.

The socket is bound before uvicorn starts so that `--port 0` gives a known port; once the server
accepts connections the process prints exactly one line, `specrouter-sim listening on
http://HOST:PORT`, which `loadtests/harness/sim.py` and other tools wait for.
"""

from __future__ import annotations

import argparse
import json
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn

from . import colocate, dialect
from .asgi import SimulatedCrash
from .profiles import ProfileError, load_profiles
from .server import create_app
from .state import SimConfig

LISTENING = "specrouter-sim listening on http://{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specrouter sim", description="Run a simulated vLLM backend.")
    p.add_argument(
        "--profile",
        default="dflash7-prob-block",
        help="profile name (see --list-profiles; (default: %(default)s))",
    )
    p.add_argument(
        "--port", type=int, default=8000, help="0 binds an ephemeral port (default: %(default)s)"
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default: %(default)s)"
    )
    p.add_argument(
        "--served-model-name", default=None, help="the model name served (default: the profile's)"
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="multiplies every duration (default: %(default)s)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="the generated text's seed (default: %(default)s)"
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        choices=("none", "summary"),
        default="none",
        help="vLLM 0.29+'s per-request acceptance in the final chunk (default: %(default)s)",
    )
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=16,
        help="requests decoded at once (vLLM's) (default: %(default)s)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=8192,
        help="tokens one engine step takes (vLLM's) (default: %(default)s)",
    )
    p.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="vLLM's: priority serves and preempts by the requests' `priority` field (default: %(default)s)",
    )
    p.add_argument(
        "--kv-events-config",
        type=json.loads,
        default=None,
        help="vLLM's: JSON with `endpoint` (connected to, bound for tcp://*), `replay_endpoint` "
        "(bound) and `topic`: KV cache events published as that release does",
    )
    p.add_argument("--faults", action="store_true", help="enable /_sim/faults and /_sim/stats")
    p.add_argument(
        "--profile-file", default=None, help="YAML file with extra or overriding profiles"
    )
    p.add_argument("--api-key", default=None, help="require this bearer key (default: none)")
    p.add_argument(
        "--embed-dim", type=int, default=None, help="embedding dimension (embed profile)"
    )
    p.add_argument(
        "--enable-auto-tool-choice",
        action="store_true",
        help='serve tool_choice "auto" (needs --tool-call-parser)',
    )
    p.add_argument(
        "--tool-call-parser",
        choices=("qwen3_coder", "hermes"),
        default=None,
        help="vLLM's tool-call parser (default: none)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=("qwen3",),
        default=None,
        help="vLLM's reasoning parser (default: none)",
    )
    p.add_argument(
        "--sse-keep-alive-interval",
        type=float,
        default=None,
        metavar="S",
        help="a `: keep-alive` comment after S seconds without an event (vLLM 0.29+)",
    )
    p.add_argument(
        "--vllm-version",
        choices=dialect.SUPPORTED,
        default=dialect.DEFAULT,
        help="the vLLM release to imitate (bytes and flags; default the deployment's, %(default)s)",
    )
    p.add_argument(
        "--engine-kind",
        choices=("vllm", "sglang"),
        default="vllm",
        help="whose chat and completions bytes and /metrics families to speak: vLLM's, or "
        "SGLang 0.5.23's (its other endpoints stay vLLM's) (default: %(default)s)",
    )
    p.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="vLLM's: cached prompt tokens in the usage",
    )
    p.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="tokens per streamed chunk (vLLM's; the finish chunk may have fewer) (default: %(default)s)",
    )
    p.add_argument(
        "--frontend-chunk-ms",
        type=float,
        default=0.0,
        help="output-merging model: API-server ms per chunk and open stream (default 0: off)",
    )
    p.add_argument("--list-profiles", action="store_true", help="list the profiles and exit")
    colocate.add_arguments(p)
    return p


# Options that are vLLM's own `vllm serve` flags: each must exist in the imitated release.
_VLLM_FLAGS = (
    "--port",
    "--host",
    "--served-model-name",
    "--seed",
    "--max-num-seqs",
    "--max-num-batched-tokens",
    "--scheduling-policy",
    "--api-key",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--reasoning-parser",
    "--per-request-spec-decode-metrics",
    "--enable-prompt-tokens-details",
    "--stream-interval",
    "--kv-events-config",
)


def _given_vllm_flags(argv: list[str]) -> list[str]:
    given = (a.split("=", 1)[0] for a in argv if a.startswith("--"))
    return [f for f in given if f in _VLLM_FLAGS]


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
    refused = dialect.refused_flags(args.vllm_version, _given_vllm_flags(argv))
    if refused:  # vLLM's argument parser stops the server before it starts
        print(
            f"specrouter sim: vLLM {args.vllm_version} has no {', '.join(refused)} "
            "(proxy/ops/deploy/vllm_flags)",
            file=sys.stderr,
        )
        return 2
    if args.stream_interval < 1:
        print("specrouter sim: --stream-interval must be >= 1", file=sys.stderr)
        return 2
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
    if args.sse_keep_alive_interval is not None and args.sse_keep_alive_interval <= 0:
        print("specrouter sim: --sse-keep-alive-interval must be > 0", file=sys.stderr)
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
        sse_keep_alive_s=args.sse_keep_alive_interval,
        vllm_version=args.vllm_version,
        engine_kind=args.engine_kind,
        enable_prompt_tokens_details=args.enable_prompt_tokens_details,
        stream_interval=args.stream_interval,
        frontend_chunk_ms=args.frontend_chunk_ms,
        scheduling_policy=args.scheduling_policy,
        kv_events=args.kv_events_config,
    )
    if args.engine:
        return colocate.main(args, profiles, config)
    try:
        config = colocate.single(args, config)
    except ValueError as err:  # MemorySplitError: a --kv-budget below one max-length request
        print(f"specrouter sim: {err}", file=sys.stderr)
        return 2
    app, sim = create_app(config)

    sock = socket.socket(
        socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM
    )
    # A restarted sim must be able to take its old port back at once (tests restart on purpose).
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((args.host, args.port))
    except OSError as err:
        sock.close()
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
