"""Replicas for the tests of what gateways share through Redis: in-process gateways on one
redis-server, each flushing and pulling every 0.1 s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from policies.compiled import compile_policy
from policies.schema import load_policy
from proxy.gateway import Gateway
from proxy.settings import Settings

FLUSH_S = PULL_S = 0.1


def replica(tmp_path: Path, name: str, doc: dict[str, Any], redis_url: str, **kw: Any) -> Gateway:
    """A gateway named `name` under `tmp_path`, serving the policy `doc`, sharing through
    `redis_url`; `kw` are more settings."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml.safe_dump(doc))
    settings = Settings(
        config=config,
        state_dir=tmp_path / name,
        redis_url=redis_url,
        session_flush_s=FLUSH_S,
        session_pull_s=PULL_S,
        **kw,
    )
    return Gateway(settings, compile_policy(load_policy(config)))
