"""The KV events subscribers of the policy's vLLM backends, one each (kv_subscriber.py),
started and stopped as the policy names them; what the per-turn accounting asks of them.

A policy applied later is followed at the next lookup: a backend whose `kv_events` changed gets
a new subscriber (the old one told to stop, not waited for: its thread leaves within one poll).
Only one process can bind an endpoint: a second gateway replica on the same host logs the bind
error and accounts without events (`unknown`, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from prometheus_client import Counter

from proxy.backends.kv_index import Residency

if TYPE_CHECKING:
    from policies.spec.document import PolicyDocument
    from policies.spec.kv_events import KvEventsSpec
    from proxy.backends.kv_subscriber import KvSubscriber


class KvEngines:
    def __init__(self, counter: Counter | None = None) -> None:
        self._subs: dict[str, tuple[KvEventsSpec, KvSubscriber]] = {}
        self._counter = counter  # specrouter_kv_events_total{backend, what}

    def sync(self, document: PolicyDocument) -> None:
        """Subscribers for exactly the backends whose policy asks for events."""
        wanted = {n: b.kv_events for n, b in document.backends.items() if b.kv_events is not None}
        for name in list(self._subs):
            if name not in wanted or self._subs[name][0] != wanted[name]:
                self._subs.pop(name)[1].stop(wait=False)
        for name, spec in wanted.items():
            if name not in self._subs:
                # imported only when a policy subscribes: pyzmq costs every start ~0.06 s
                from proxy.backends.kv_subscriber import KvSubscriber

                sub = KvSubscriber(
                    spec.endpoint, spec.replay, spec.topic, name=name, count=self._count(name)
                )
                sub.start()
                self._subs[name] = (spec, sub)

    def _count(self, name: str) -> Callable[[str, int], None] | None:
        counter = self._counter
        if counter is None:
            return None
        return lambda what, n: counter.labels(name, what).inc(n)  # thread-safe

    def residency(self, engine: str, session: str) -> Residency | None:
        found = self._subs.get(engine)
        return None if found is None else found[1].residency(session)

    def close(self) -> None:
        for _, sub in self._subs.values():
            sub.stop(wait=False)
        self._subs.clear()
