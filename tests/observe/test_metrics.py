"""FastHistogram's weighted observation: the same buckets as one sample per token; a finished
record's counters."""

from __future__ import annotations

from array import array

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.finished import observe_record
from proxy.observe.metrics import ITL_BUCKETS, FastHistogram, GatewayMetrics
from proxy.record.measure import Measurement
from proxy.record.request import RequestRecord


def _series(h: FastHistogram) -> dict[str, float]:
    (family,) = list(h.collect())
    return {f"{s.name}{sorted(s.labels.items())}": s.value for s in family.samples}


@pytest.mark.parametrize(
    "gaps,tokens",
    [
        ([0.030, 0.031, 0.029], [1, 1, 1]),
        ([0.040, 0.036, 0.200, 0.001], [4, 3, 1, 2]),  # speculative chunks, a stall, a fast pair
        ([], []),
    ],
)
def test_weighted_matches_one_sample_per_token(gaps: list[float], tokens: list[int]) -> None:
    m = Measurement(0.0, step_gaps=array("d", gaps), step_tokens=array("I", tokens))
    a = FastHistogram("x_itl_seconds", "itl", ("route",), ITL_BUCKETS)
    b = FastHistogram("x_itl_seconds", "itl", ("route",), ITL_BUCKETS)
    a.observe_many(("r",), m.itl_per_token())
    b.observe_weighted(("r",), m.step_gaps, m.step_tokens)
    sa, sb = _series(a), _series(b)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert sb[k] == pytest.approx(sa[k], abs=1e-12), k
    if tokens:
        count = next(v for k, v in sb.items() if k.startswith("x_itl_seconds_count"))
        assert count == sum(tokens)


def test_a_finished_record_gives_every_counter_of_its_way() -> None:
    """Retries, failures, adaptations and a continuation, counted once the request ended, from
    its record alone; the decision under the decided backend, the request under the answering."""
    g = GatewayMetrics()
    r = RequestRecord("id", "alice", "chat", route="coder", backend="b", reason="load")
    r.decided, r.defaults_applied, r.outcome = "a", ("temperature",), "client_gone"
    r.upstream_errors = (("a", "connect"), ("b", "midstream"))
    r.retried_to, r.adaptations = ("b",), (("max_tokens", "a"), ("max_tokens", "b"))
    r.continuations, r.continuations_refused = (("b", "c"),), (("b", "a", "down"),)
    r.m.t_end = 1.0
    observe_record(g, r)
    text = generate_latest(g.registry).decode()

    def value(name: str, **labels: str) -> float:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0

    assert value("specrouter_decisions_total", variant="a", reason="load") == 1
    assert value("specrouter_defaults_applied_total", route="coder", field="temperature") == 1
    assert value("specrouter_upstream_errors_total", backend="a", kind="connect") == 1
    assert value("specrouter_upstream_errors_total", backend="b", kind="midstream") == 1
    assert value("specrouter_retries_total", route="coder", backend="b") == 1
    assert value("specrouter_adaptations_total", rule="max_tokens", backend="a") == 1
    assert value("specrouter_adaptations_total", rule="max_tokens", backend="b") == 1
    assert value("specrouter_continuations_total", from_backend="b", to_backend="c") == 1
    assert value("specrouter_continuations_refused_total", to_backend="a", reason="down") == 1
    assert value("specrouter_client_disconnects_total", route="coder", backend="b") == 1
    assert value("specrouter_requests_total", backend="b", outcome="client_gone") == 1
