"""float32 values as orjson writes them (vLLM answers float embeddings with orjson: 0.33 always,
0.28 whenever orjson is importable): the shortest decimal that reads back as the same float32,
`-0.08396084` where Python's doubles write `-0.08396083861589432`.

Pure Python (numpy, which orjson needs to write float32 itself, is no dependency here). Each
precision is tried for the whole vector at once in C-level maps, and the chosen decimal is handed
to orjson as the double it denotes (whose shortest form is that decimal); only the magnitudes
where orjson writes a float32 differently from a double are written here. Measured: 1.4 ms per
1024-value vector (the previous double form: 0.04 ms; one format() per value per precision: 5 ms).
"""

from __future__ import annotations

import array
from operator import eq

import orjson

# orjson writes a float32 positionally from 1e-6 up to below 1e13, a double from 1e-5 to below
# 1e16; in between the two differ (`0.000001` / `1e-6`). Below the normal range a float32 can
# need fewer than 6 digits.
_F32_MIN_NORMAL = 1.1754944e-38


def _same_as_double(x: float) -> bool:
    a = abs(x)
    return a == 0.0 or (_F32_MIN_NORMAL <= a < 1e-6) or (1e-5 <= a < 1e13) or a >= 1e16


def _orjson_form(sci: str) -> str:
    """`-8.396084e-02` (Python's `e` format) as orjson writes that float32."""
    mant, _, exp_s = sci.partition("e")
    sign = "-" if mant.startswith("-") else ""
    digits = mant.lstrip("-").replace(".", "").rstrip("0") or "0"
    exp = int(exp_s)
    if not -6 <= exp < 13:
        frac = "." + digits[1:] if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{frac}e{'+' if exp > 0 else ''}{exp}"
    if exp < 0:
        return f"{sign}0.{'0' * (-exp - 1)}{digits}"
    whole, frac = digits[: exp + 1], digits[exp + 1 :]
    return f"{sign}{whole.ljust(exp + 1, '0')}.{frac or '0'}"


def _shortest_text(x: float) -> str:
    """One value's shortest round-tripping decimal, in Python's `e` format."""
    for digits in range(1, 10):
        text = format(x, f".{digits - 1}e")
        if array.array("f", [float(text)])[0] == x:
            return text
    return format(x, ".8e")


def _rounded(values: list[float], digits: int) -> list[float]:
    """Each value rounded to `digits` significant decimal digits (formatted and read back in
    one batch: ~5x faster than per-value format() and float())."""
    text = (f"%.{digits - 1}e," * len(values)) % tuple(values)
    rounded: list[float] = orjson.loads(f"[{text[:-1]}]")
    return rounded


def _candidates(values: list[float], digits: int) -> tuple[list[float], list[bool]]:
    cand = _rounded(values, digits)
    return cand, list(map(eq, array.array("f", cand).tolist(), values))


Values = list[float | orjson.Fragment]  # what orjson writes as a float32 array


def shortest(vec: array.array[float]) -> Values:
    """Each float32 of `vec` as the double of its shortest decimal (orjson writes that decimal),
    or as the text orjson writes for it where a double would be written otherwise."""
    values = vec.tolist()
    # Rounding to 6 digits finds any shorter decimal too (float32 steps are finer than 1e-6
    # relative); 9 digits always read back.
    (c6, k6), (c7, k7), (c8, k8) = (_candidates(values, d) for d in (6, 7, 8))
    c9 = _rounded(values, 9)
    chosen = [
        a if ka else b if kb else c if kc else d
        for a, ka, b, kb, c, kc, d in zip(c6, k6, c7, k7, c8, k8, c9, strict=True)
    ]
    return [
        x if _same_as_double(x) else orjson.Fragment(_orjson_form(_shortest_text(v)))
        for x, v in zip(chosen, values, strict=True)
    ]
