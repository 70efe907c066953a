"""The agents' install cache, for the tests that run real agents (tests/agents/ against the
demo, tests/engines/vllm_agents/ against a real vLLM)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.agents.demo import ROOT


def installed_agents() -> Path:
    """The agents' install cache (scripts/agents.sh installs what is missing)."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "agents.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        check=True,
    )
    return Path(done.stdout.strip().splitlines()[-1])
