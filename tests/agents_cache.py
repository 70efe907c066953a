"""The agents' install cache, for the tests that run real agents (tests/agents/ against the
demo, tests/engines/vllm_agents/ against a real vLLM): beside both folders, since tests/agents/
imports tests/engines/ and the import back would make a circle."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
