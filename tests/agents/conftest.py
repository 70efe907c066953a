from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agents.demo import ROOT, Demo, start_demo, stop_demo


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
    done = subprocess.run(
        [str(ROOT / "scripts" / "agents.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])
