"""The KV-sessions test starts its own vLLM (a small KV cache: loadtests/harness/vllm_kv.py), past
the suite's 120 s per-test timeout on a loaded machine."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.harness.vllm import START_TIMEOUT_S

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 300))
