"""A backend's `kv_events` (policies/spec/kv_events.py): only loopback or private endpoints,
only on a vLLM backend that generates on one url, and the `--kv-events-config` the deploy
renders for it (the engine connects out, its replay bound there)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from policies.spec.backends import BackendSpec

BASE: dict[str, Any] = {"url": "http://127.0.0.1:8001", "served_model_name": "m"}
EVENTS = {"endpoint": "tcp://127.0.0.1:5557", "replay": "tcp://127.0.0.1:5567"}


@pytest.mark.parametrize(
    "change",
    [
        {"kv_events": {"endpoint": "tcp://*:5557"}},  # vLLM would bind every interface
        {"kv_events": {**EVENTS, "replay": "tcp://0.0.0.0:5567"}},
        {"kv_events": {"endpoint": "tcp://8.8.8.8:5557"}},  # a public address
        {"kind": "sglang", "kv_events": EVENTS},
        {"task": "embed", "kv_events": EVENTS},
        {
            "url": None,
            "urls": ["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
            "kv_events": EVENTS,
        },
        {"kv_events": {**EVENTS, "extra": 1}},
    ],
)
def test_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        BackendSpec.model_validate({**BASE, **change})


def test_engine_config() -> None:
    spec = BackendSpec.model_validate({**BASE, "kv_events": {**EVENTS, "topic": "kv"}})
    assert spec.kv_events is not None
    assert spec.kv_events.engine_config() == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "replay_endpoint": "tcp://127.0.0.1:5567",
        "topic": "kv",
    }
    assert json.dumps(spec.kv_events.engine_config())  # a JSON command-line value
