"""The KV-sessions test's own vLLM (a small KV cache: loadtests/harness/vllm_kv.py), booted in
the background by tests/engines/boot.py, which runs this folder at the end of the session. The
first test waits for it: past the suite's 120 s per-test timeout on a loaded machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests.harness.vllm import START_TIMEOUT_S
from loadtests.harness.vllm_kv import SmallKvVllm
from tests.engines.boot import BOOT

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.timeout(START_TIMEOUT_S + 300))


@pytest.fixture(scope="module")
def small_kv_vllm() -> Iterator[SmallKvVllm]:
    """loadtests/bench/kv_sessions_engines.small_kv_server's, started; stopped after the
    module (its tests share the one engine: the last one stops it)."""
    try:
        server = BOOT.take("kv")
        assert isinstance(server, SmallKvVllm)
        yield server
    finally:
        BOOT.done("kv")
