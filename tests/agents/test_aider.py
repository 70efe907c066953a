"""aider (its own Python 3.11 venv) edits a scratch file through the demo, as docs/clients.md says."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.agents.demo import Demo
from tests.agents.recipes import run_recipe

pytestmark = pytest.mark.slow


def test_aider_completes_on_a_scratch_file(demo: Demo, agents: Path, tmp_path: Path) -> None:
    bin_dir = agents / "aider" / "bin"
    if not (bin_dir / "aider").exists():
        pytest.skip(f"aider is not installed in {bin_dir} (scripts/agents.sh)")
    (tmp_path / "hello.py").write_text("def hello():\n    return 'hi'\n")
    since = time.time()
    done = run_recipe(
        "aider", demo, tmp_path, extra_path=(bin_dir,), env={"HOME": str(tmp_path)}
    )  # aider writes its caches under HOME
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    rows = demo.rows(since)
    assert rows, out
    for row in rows:
        assert row["outcome"] == "ok" and row["completion_tokens"] > 0
        assert row["ttft_s"] is not None and 0 < row["ttft_s"] <= row["e2e_s"]
