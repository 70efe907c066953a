"""The request body's shape, checked in C where it can be: how many containers its raw bytes may
hold (before the parse), how deep its values nest and whether its integers fit 64 bits (one
serialisation of each top-level container, kept for the upstream body: proxy/relay/rewrite.py).
proxy/relay/fields.py's `check_fields` runs them after its per-field checks."""

from __future__ import annotations

import re
import threading
from typing import Any

import orjson

# Each top-level container the check serialised: the value (by identity: the upstream body
# reuses the bytes only for the very object checked, the body is never edited in place) and
# its JSON, a view into the bytes orjson wrote (no copy), sent upstream as it is.
Encoded = dict[str, tuple[Any, memoryview]]
Problem = tuple[str, str | None]  # message, param: the 400's

_CONTAINERS = (dict, list)
_NEEDS_A_LOOK = frozenset({dict, list, float})
# orjson reads an integer beyond 64 bits as a float, which it then writes back as another
# number (1e+20): such a number without a fraction is refused, whatever its spelling.
_INT64 = float(2**63)
_ORJSON_DEPTH = 254  # the deepest value orjson writes (its recursion limit is 255)
_WRAPPERS = threading.local()  # `_wrapper`'s, per thread: a slot filled during a check
_EXPONENT = re.compile(rb"e\+")  # a literal: `re` finds it at C speed (bytes.find is slower)
_DIGITS = frozenset(b"0123456789")
_MANTISSA = frozenset(b"0123456789.-")
_VALUE_START = frozenset(b"[,:")  # orjson writes no whitespace


def shape(
    body: dict[str, Any], max_depth: int, encoded: Encoded, size: int | None = None
) -> Problem | None:
    """The body's nesting within `max_depth` and its integers within 64 bits.

    orjson does the walk, in C, one top-level container at a time: it refuses to write a value
    nested beyond `_ORJSON_DEPTH`, so a container (depth 2) wrapped in `wrap` lists fails
    exactly when the body is too deep; and it writes every float of 2**63 or more with an
    exponent (`e+`). Only a container that fails or has such a number is walked in Python, to
    name the field. The bytes written go into `encoded` (a view, not a copy): the upstream body
    reuses them instead of serialising the same containers again.

    `size`: the body's JSON length, when known. Each level of nesting opens and closes a
    bracket, so a body shorter than `2 * (max_depth + 1)` bytes cannot be too deep: its
    containers are written without the wrapper (~15 us of a one-line request, cold)."""
    wrap = 0 if size is not None and size < 2 * (max_depth + 1) else _ORJSON_DEPTH - max_depth + 1
    outer, inner = _wrapper(wrap)
    try:
        for name, value in body.items():
            kind = type(value)
            if kind is float and abs(value) >= _INT64 and value.is_integer():
                return f"`{name}` has an integer beyond 64 bits", name
            if kind not in _CONTAINERS:
                continue
            inner[0] = value
            try:
                out: bytes | None = orjson.dumps(outer if wrap else value)
            except orjson.JSONEncodeError:
                out = None
            if out is None or _has_exponent(out):
                problem = _walk({name: value}, max_depth)
                if problem is not None:
                    return problem
            if out is not None:  # the container's own JSON, inside the `wrap` brackets
                encoded[name] = (value, memoryview(out)[wrap : len(out) - wrap])
        return None
    finally:
        inner[0] = None  # the body is not held by the wrapper past its check


def _wrapper(wrap: int) -> tuple[list[Any], list[Any]]:
    """`wrap` nested lists and the innermost, whose one slot `shape` fills: made once per
    depth and thread, not per request (~130 lists, 4 us)."""
    made: dict[int, tuple[list[Any], list[Any]]] = _WRAPPERS.__dict__.setdefault("made", {})
    found = made.get(wrap)
    if found is None:
        inner: list[Any] = [None]
        outer: list[Any] = inner
        for _ in range(wrap - 1):
            outer = [outer]
        found = made[wrap] = (outer, inner)
    return found


def _has_exponent(out: bytes) -> bool:
    """Whether orjson wrote a number with an exponent (`1e+20`, so 1e16 or more): `e+` found in
    C, then the bytes before it read as a mantissa that starts a value: text such as `size+1`
    in a string costs no walk (looking at each `+` in Python took 250 us on an agent's body)."""
    if b"+" not in out:  # memchr: most bodies without code have none
        return False
    for found in _EXPONENT.finditer(out):
        i = found.start() - 1
        if i < 0 or out[i] not in _DIGITS:
            continue
        while i >= 0 and out[i] in _MANTISSA:
            i -= 1
        if i < 0 or out[i] in _VALUE_START:
            return True
    return False


def _walk(body: dict[str, Any], max_depth: int) -> Problem | None:
    """`shape`'s walk in Python: the problem names the top-level field it is in. Containers
    of plain scalars are skipped in C."""
    for name, top in body.items():
        stack: list[tuple[Any, int]] = [([top], 1)]  # the body is depth 1
        while stack:
            node, depth = stack.pop()
            items = node.values() if type(node) is dict else node
            if _NEEDS_A_LOOK.isdisjoint(map(type, items)):
                continue
            for value in items:
                kind = type(value)
                if kind in _CONTAINERS:
                    if depth >= max_depth:
                        return f"`{name}` is nested deeper than {max_depth} levels", name
                    stack.append((value, depth + 1))
                elif kind is float and abs(value) >= _INT64 and value.is_integer():
                    return f"`{name}` has an integer beyond 64 bits", name
    return None
