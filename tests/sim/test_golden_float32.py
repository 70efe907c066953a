"""float32 embeddings as vLLM's orjson writes them (loadtests/sim/float32.py; the golden
emb_float fixtures check it end to end)."""

from __future__ import annotations

import array
import random

import orjson
import pytest

from loadtests.sim.float32 import shortest


def _dumps(values: list[float]) -> bytes:
    return orjson.dumps(shortest(array.array("f", values)))


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (-0.08396083861589432, b"-0.08396084"),  # golden emb_float
        (0.5, b"0.5"),
        (0.0, b"0.0"),
        (-0.0, b"-0.0"),
        (1.0, b"1.0"),
        (1e-6, b"0.000001"),  # a double would be 1e-6
        (9.99999e-6, b"0.00000999999"),
        (1e-7, b"1e-7"),
        (1e12, b"1000000000000.0"),
        (1e13, b"1e+13"),  # a double would be 10000000000000.0
        (1e-45, b"1e-45"),  # the smallest subnormal: fewer than 6 digits
    ],
)
def test_known_values(value: float, text: bytes) -> None:
    assert _dumps([value]) == b"[" + text + b"]"


def test_matches_orjson_on_numpy_float32() -> None:
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    values = [rng.gauss(0.0, 1.0) * 10 ** rng.randint(-44, 17) for _ in range(4000)]
    values += [rng.gauss(0.0, 1.0) / 32 for _ in range(4000)]  # a unit vector's magnitudes
    expected = orjson.dumps(np.array(values, dtype=np.float32), option=orjson.OPT_SERIALIZE_NUMPY)
    assert _dumps(values) == expected


def test_empty() -> None:
    assert _dumps([]) == b"[]"
