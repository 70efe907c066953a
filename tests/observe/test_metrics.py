"""FastHistogram's weighted observation: the same buckets as one sample per token."""

from __future__ import annotations

from array import array

import pytest

from proxy.observe.metrics import ITL_BUCKETS, FastHistogram
from proxy.record.measure import Measurement


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
