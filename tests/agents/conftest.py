from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.demo import Demo, start_demo, stop_demo
from tests.agents_cache import installed_agents


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    running = start_demo(Path(tmp_path_factory.mktemp("demo")))
    try:
        yield running
    finally:
        stop_demo(running)


@pytest.fixture(scope="session")
def agents() -> Path:
    """The agents' install cache (scripts/agents.sh installs what is missing)."""
    return installed_agents()
