"""What the operator allows a policy to name, passed in as data: policies/ reads no files.

The admin-editable policy may only *name* a repair action or an engine secret; the operator
defines them in a server-side file (proxy/operator.py reads it). The gateway validates every
policy it applies against a `ValidationContext` built from that file. Offline tools that have no
operator file pass None, and then only the shape of names and URLs is checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, slots=True)
class ValidationContext:
    actions: frozenset[str] = frozenset()  # repair actions the operator defined
    secrets: frozenset[str] = frozenset()  # engine secrets the operator defined
    engine_hosts: frozenset[str] = LOOPBACK_HOSTS  # hosts an engine URL may name
    # The engines off loopback ("host:port") each secret may be sent to, besides loopback
    # ones. A policy edit names the secret; the operator says where it may go.
    secret_engines: Mapping[str, frozenset[str]] = field(default_factory=dict)
