"""Deterministic code-like text, and a tokenizer stand-in.

There is no real tokenizer here: prompts are split into BPE-sized pieces (about four characters
of code each, special tokens whole) so that token counts, prefix-cache blocks and `token_ids`
behave like a real model's without shipping a vocabulary. Generated text is Python-ish code drawn
from a seeded RNG, one piece per token, so the same seed and request give the same text whatever
the batching, chunking or acceptance did.
"""

from __future__ import annotations

import hashlib
import random
import re
import zlib
from collections import deque
from collections.abc import Iterable

VOCAB_SIZE = 151_936  # Qwen3 family
EOS_TOKEN_ID = 151_645  # <|im_end|>
THINK_ID, END_THINK_ID = 151_667, 151_668
# Qwen3's added tokens keep their real ids (the reasoning parser and usage details count on them).
_ADDED_IDS = {
    "<tool_call>": 151_657,
    "</tool_call>": 151_658,
    "<think>": THINK_ID,
    "</think>": END_THINK_ID,
}

# Special tokens first, then words (<= 8 letters per piece), numbers, punctuation runs,
# newlines and indentation; the final `.` guarantees the pattern covers any input.
_PIECE_RE = re.compile(
    r"<\|[a-z_]+\|>|[ \t]?[^\W\d_]{1,8}|[ \t]?\d{1,3}|[ \t]?_|[ \t]?[^\w\s]{1,2}|\n+|[ \t]{1,8}|.",
    re.DOTALL,
)


def split_pieces(text: str) -> list[str]:
    """Split text into token-sized pieces (the stand-in for a tokenizer)."""
    return _PIECE_RE.findall(text)


def piece_id(piece: str) -> int:
    """A stable token id for a piece (crc32, so identical across processes and runs)."""
    added = _ADDED_IDS.get(piece)
    if added is not None:
        return added
    return zlib.crc32(piece.encode("utf-8")) % (VOCAB_SIZE - 1000) + 100


def token_ids(pieces: Iterable[str]) -> list[int]:
    return [piece_id(p) for p in pieces]


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from any reprs; stable across processes (unlike `hash`)."""
    h = hashlib.blake2b(digest_size=8)
    for part in parts:
        h.update(repr(part).encode("utf-8"))
        h.update(b"\x1f")
    return int.from_bytes(h.digest(), "big") >> 1


_NOUNS = (
    "config",
    "path",
    "items",
    "result",
    "value",
    "buffer",
    "request",
    "response",
    "node",
    "index",
    "cache",
    "entry",
    "token",
    "stream",
    "batch",
    "record",
    "user",
    "session",
    "queue",
    "payload",
    "offset",
    "limit",
    "header",
    "state",
    "count",
    "chunk",
    "target",
    "source",
    "metrics",
    "window",
    "handler",
    "policy",
    "route",
    "backend",
    "timeout",
    "retry",
)
_VERBS = (
    "parse",
    "load",
    "build",
    "update",
    "fetch",
    "merge",
    "apply",
    "encode",
    "decode",
    "check",
    "compute",
    "resolve",
    "render",
    "flush",
    "collect",
    "split",
    "validate",
    "normalize",
    "schedule",
    "emit",
    "read",
    "write",
    "select",
    "filter",
)
_TYPES = ("int", "str", "float", "bool", "bytes", "list[str]", "dict[str, int]", "None")
_COMMENTS = (
    "keep the order stable for the caller",
    "the upstream may send partial frames",
    "fall back to the default when unset",
    "this runs once per request, keep it cheap",
    "an empty batch is valid and returns early",
    "retry only idempotent calls",
    "values are clamped to the configured range",
    "the lock is held for the shortest time possible",
)


class CodeText:
    """An endless, deterministic stream of code-like token pieces for one sequence, after an
    optional scripted prefix (reasoning, tool-call markup, a final answer: see scripted.py)."""

    __slots__ = ("_rng", "_pending", "_indent", "_in_func")

    def __init__(self, seed: int, prefix: Iterable[str] = ()) -> None:
        self._rng = random.Random(seed)
        self._pending: deque[str] = deque(prefix)
        self._indent = 0
        self._in_func = False

    def next_pieces(self, n: int) -> list[str]:
        out: list[str] = []
        pending = self._pending
        while len(out) < n:
            if not pending:
                self._line()
            out.append(pending.popleft())
        return out

    # -- line generator ---------------------------------------------------------------------

    def _name(self) -> str:
        r = self._rng
        if r.random() < 0.5:
            return r.choice(_NOUNS)
        return f"{r.choice(_NOUNS)}_{r.choice(_NOUNS)}"

    def _emit(self, text: str) -> None:
        self._pending.extend(split_pieces(text))

    def _line(self) -> None:
        r = self._rng
        pad = "    " * self._indent
        if not self._in_func:
            args = ", ".join(f"{self._name()}: {r.choice(_TYPES)}" for _ in range(r.randint(1, 3)))
            ret = r.choice(_TYPES)
            self._emit(f"\ndef {r.choice(_VERBS)}_{self._name()}({args}) -> {ret}:\n")
            self._emit(
                f'    """{r.choice(_VERBS).capitalize()} the {r.choice(_NOUNS)} '
                f'and return the {r.choice(_NOUNS)}."""\n'
            )
            self._in_func = True
            self._indent = 1
            return
        roll = r.random()
        if roll < 0.12 and self._indent < 3:
            self._emit(f"{pad}for {self._name()} in {self._name()}:\n")
            self._indent += 1
        elif roll < 0.24 and self._indent < 3:
            op = r.choice(("is None", "> 0", "== 0", "in seen", "< limit"))
            self._emit(f"{pad}if {self._name()} {op}:\n")
            self._indent += 1
        elif roll < 0.34:
            self._emit(f"{pad}# {r.choice(_COMMENTS)}\n")
        elif roll < 0.50 and self._indent > 1:
            self._emit(f"{pad}{r.choice(('continue', 'break', 'pass'))}\n")
            self._indent -= 1
        elif roll < 0.60 and self._indent == 1:
            self._emit(f"{pad}return {self._name()}\n")
            self._in_func = False
            self._indent = 0
        else:
            args = ", ".join(self._name() for _ in range(r.randint(0, 3)))
            self._emit(f"{pad}{self._name()} = {r.choice(_VERBS)}({args})\n")
            if self._indent > 1 and r.random() < 0.3:
                self._indent -= 1
