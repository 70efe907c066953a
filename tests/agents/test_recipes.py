"""docs/clients.md's recipes run as printed against the demo: curl, openai-python, openai-node."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from tests.agents.demo import Demo
from tests.agents.recipes import recipes, run_recipe

pytestmark = pytest.mark.slow


def test_env_recipe_names_the_demo_defaults() -> None:
    env = recipes()["env"]
    assert "SPECROUTER_URL=https://127.0.0.1:8443/v1" in env  # proxy/ops/demo.py's --listen
    assert ".state/demo/tls/ca.pem" in env and ".state/demo/client.key" in env


def test_curl_recipe(demo: Demo, tmp_path: Path) -> None:
    since = time.time()
    done = run_recipe("curl", demo, tmp_path)
    assert done.returncode == 0, done.stderr
    assert '"id":"coder"' in done.stdout  # GET /v1/models/{id}
    assert "data: [DONE]" in done.stdout
    (row,) = demo.rows(since)
    assert row["completion_tokens"] > 0 and row["ttft_s"] is not None


def test_openai_python_recipe(demo: Demo, tmp_path: Path) -> None:
    # The recipe runs from the clone's root, where `make install` put .venv.
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parents[1])
    done = run_recipe("openai-python", demo, tmp_path)
    assert done.returncode == 0, done.stderr
    first, rest = done.stdout.split("\n", 1)
    assert first == "coder" and rest.strip()  # models.retrieve, then streamed text


def test_openai_node_recipe(demo: Demo, agents: Path, tmp_path: Path) -> None:
    modules = agents / "npm" / "node_modules"
    if not (modules / "openai").is_dir():
        pytest.skip(f"the openai npm package is not in {modules} (scripts/agents.sh)")
    done = run_recipe("openai-node", demo, tmp_path, env={"NODE_PATH": str(modules)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
