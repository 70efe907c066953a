"""Counter and Gauge with their children kept (proxy/observe/labelled.py): the same series as
the library's, a removed or cleared label set counted afresh, wrong labels still refused."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from proxy.observe.labelled import Counter, Gauge


def test_kept_children_count_as_the_library_does() -> None:
    r = CollectorRegistry()
    c = Counter("x", "x", ("route", "outcome"), registry=r)
    g = Gauge("g", "g", ("backend",), registry=r)
    for _ in range(3):
        c.labels("a", "ok").inc()
    c.labels(route="a", outcome="ok").inc()  # by name: the library's own child, the same series
    c.labels("a", "error").inc(2)
    g.labels("b").inc()
    g.labels("b").inc()
    g.labels("b").dec()
    assert c.labels("a", "ok") is c.labels("a", "ok")
    assert r.get_sample_value("x_total", {"route": "a", "outcome": "ok"}) == 4
    assert r.get_sample_value("x_total", {"route": "a", "outcome": "error"}) == 2
    assert r.get_sample_value("g", {"backend": "b"}) == 1

    c.remove("a", "ok")
    c.labels("a", "ok").inc()  # a new child, not the removed one kept
    assert r.get_sample_value("x_total", {"route": "a", "outcome": "ok"}) == 1
    g.clear()
    g.labels("b").inc()
    assert r.get_sample_value("g", {"backend": "b"}) == 1
    with pytest.raises(ValueError, match="Incorrect label count"):
        c.labels("a")
