from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.demo import Demo, start_demo, stop_demo
from tests.agents_cache import installed_agents


@pytest.fixture(scope="package")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    """One demo for every module here that only sends requests and reads back its own rows
    (test_demo.py, which edits the policy, fails engines and counts every request, and
    test_agent_sessions.py, on another policy, start their own)."""
    running = start_demo(Path(tmp_path_factory.mktemp("demo")))
    try:
        yield running
    finally:
        stop_demo(running)


@pytest.fixture(scope="session")
def agents() -> Path:
    """The agents' install cache (scripts/agents.sh installs what is missing)."""
    return installed_agents()
