"""A vLLM backend's KV cache events (`--kv-events-config`): where the gateway listens for them
and where the engine answers a replay.

vLLM connects its publisher out to a `tcp://host:port` endpoint (it binds only a `tcp://*`
wildcard, every interface), so the gateway binds `endpoint`; the engine binds `replay`. Both
must be a loopback or private IP literal: the events name every session's blocks and carry
every prompt's token ids, and the replay socket re-sends its buffer to whoever asks.
"""

from __future__ import annotations

import ipaddress

from pydantic import field_validator

from policies.spec.base import StrictModel


def private_endpoint(endpoint: str) -> str:
    """`endpoint` when it is `tcp://ADDRESS:PORT` with a loopback or private IP literal (PORT
    may be `*`: any free port); else ValueError saying why."""
    rest = endpoint.removeprefix("tcp://")
    host, sep, port = rest.rpartition(":")
    host = host.strip("[]")
    if rest == endpoint or not sep or not (port.isdigit() or port == "*"):
        raise ValueError(f"KV events endpoint {endpoint!r}: expected tcp://ADDRESS:PORT")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(
            f"KV events endpoint {endpoint!r}: the address must be an IP literal"
        ) from None
    if address.is_unspecified or not (address.is_loopback or address.is_private):
        raise ValueError(
            f"KV events endpoint {endpoint!r}: only a loopback or private address (the events "
            "name every session's blocks)"
        )
    return endpoint


class KvEventsSpec(StrictModel):
    endpoint: str  # the gateway binds it; the engine connects
    replay: str | None = None  # the engine binds it; the gateway asks it for a gap
    topic: str = ""

    @field_validator("endpoint", "replay")
    @classmethod
    def _private(cls, value: str | None) -> str | None:
        return None if value is None else private_endpoint(value)

    def engine_config(self) -> dict[str, object]:
        """vLLM's `--kv-events-config` for it."""
        out: dict[str, object] = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": self.endpoint,
        }
        if self.replay is not None:
            out["replay_endpoint"] = self.replay
        if self.topic:
            out["topic"] = self.topic
        return out
