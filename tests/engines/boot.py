"""The real-vLLM servers of tests/engines/vllm*, booted on a background thread from the end of
collection (loadtests/harness/vllm_boot.py), so that they start while the tests before them run.

Which server a test needs is read from the fixtures it uses (NEEDS); only the servers of the
selected tests boot, in the order of their first test. The folders in LAST run at the end of
the session: their engines boot once the folder before them has stopped its three (at most
three engines at once, about 3 GiB each), while the rest of the suite runs. None boots while
tests/engines/vllm/'s tests run (they hold three), whose figures are timed.

The ngram engine (the recorded agents' and the restart test's) and the small-KV one publish
their KV cache events (`--kv-events-config`) to a loopback port picked at boot, which the
folder's gateway policy binds (KV_EVENTS: the backend's `kv_events`); vLLM connects out to it,
and until a gateway binds, its batches wait in the engine's replay buffer (the subscriber asks
for them from 0 at its first batch).

SPECROUTER_TEST_VLLM_BOOT=0 boots each engine only when its first test asks for it (the
servers a fixture takes together side by side), to compare the two.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from loadtests.harness.ports import free_port
from loadtests.harness.vllm import VllmServer, vllm_home
from loadtests.harness.vllm_boot import Boot

HERE = Path(__file__).resolve().parent
# (folder, fixture) -> the servers that fixture takes from BOOT.
NEEDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("vllm", "vllm"): ("draft", "ngram", "embed"),
    ("vllm_agents", "stack"): ("agent",),
    ("vllm_kv", "small_kv_vllm"): ("kv",),
}
LAST = ("vllm_agents", "vllm_kv")
_NAMES = tuple(dict.fromkeys(folder for folder, _ in NEEDS))
# The same folders as pytest names them (from the root): one unit of work (tests/lanes.py).
FOLDERS = tuple(f"{HERE.relative_to(HERE.parents[1]).as_posix()}/{f}" for f in _NAMES)
# BOOT key -> the engine's KV events (a policy backend's `kv_events`), fixed at its first boot
# so that a restart on the same port publishes where it did.
KV_EVENTS: dict[str, dict[str, str]] = {}


def kv_events_args(key: str) -> tuple[str, ...]:
    """`--kv-events-config` for the engine `key`: it connects to a loopback port the gateway
    binds and binds its replay socket on another."""
    spec = KV_EVENTS.setdefault(
        key,
        {
            "endpoint": f"tcp://127.0.0.1:{free_port()}",
            "replay": f"tcp://127.0.0.1:{free_port()}",
        },
    )
    config = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": spec["endpoint"],
        "replay_endpoint": spec["replay"],
    }
    return ("--kv-events-config", json.dumps(config))


def _agent(home: Path) -> VllmServer:
    """scripts/vllm_agent_model.py's model; two agents' requests at a time at most."""
    return VllmServer(home, "ngram", model=home / "agent", max_num_seqs=2)


def _small_kv() -> VllmServer:
    # Imported here: the benchmark's modules (uvicorn, the simulator) cost seconds at every
    # pytest start otherwise, from the root conftest.
    from loadtests.bench.kv_sessions_engines import small_kv_server

    server = small_kv_server()
    server.extra_args = kv_events_args("kv")
    return server


BOOT = Boot(
    {
        "draft": lambda: VllmServer(vllm_home(), "draft"),
        "ngram": lambda: VllmServer(vllm_home(), "ngram", extra_args=kv_events_args("ngram")),
        "embed": lambda: VllmServer(vllm_home(), "embed"),
        "agent": lambda: _agent(vllm_home()),
        "kv": _small_kv,
    },
    at_once=3,
)


def _folder(item: pytest.Item) -> str | None:
    parents = item.path.parents
    return next((name for name in _NAMES if HERE / name in parents), None)


def reorder(items: list[pytest.Item]) -> None:
    """The LAST folders' tests moved to the end, in their order."""
    last = [item for item in items if _folder(item) in LAST]
    last.sort(key=lambda item: LAST.index(_folder(item) or ""))
    rest = [item for item in items if _folder(item) not in LAST]
    items[:] = rest + last


def boot_for(items: list[pytest.Item]) -> None:
    """Start booting the servers these tests need, in the order they need them."""
    order: list[str] = []
    for item in items:
        folder = _folder(item)
        for fixture in getattr(item, "fixturenames", ()):
            order += [k for k in NEEDS.get((folder or "", fixture), ()) if k not in order]
    if order and os.environ.get("SPECROUTER_TEST_VLLM_BOOT", "1") != "0":
        BOOT.start(order)
