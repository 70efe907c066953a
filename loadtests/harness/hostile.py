"""Hand-made malformed chat bodies, each with the status the gateway must answer.

Used by the hostile-input suite (tests/relay/test_hostile_openapi.py, against a gateway started
with `--max-body-bytes MAX_BODY`) and sent under load by the fault soak.
"""

from __future__ import annotations

MAX_BODY = 65536  # the hostile suite's gateway body limit: "too large" is just over it

_NEST = b"[" * 5000 + b"]" * 5000
BAD_BODIES: list[tuple[str, bytes, dict[bytes, bytes], int]] = [
    # (what, body, extra headers, expected status)
    ("empty body", b"", {}, 400),
    ("not json", b"hello", {}, 400),
    ("truncated json", b'{"model": "coder", "messages": [', {}, 400),
    ("invalid utf-8", b'{"model": "c\xff\xfeoder", "messages": []}', {}, 400),
    ("lone surrogate", b'{"model": "\\ud800", "messages": []}', {}, 400),
    ("nan", b'{"model": "coder", "messages": [], "temperature": NaN}', {}, 400),
    ("1e400", b'{"model": "coder", "messages": [], "temperature": 1e400}', {}, 400),
    ("array", b'[{"model": "coder"}]', {}, 400),
    ("null", b"null", {}, 400),
    ("string", b'"coder"', {}, 400),
    ("deep nesting", b'{"model": "coder", "messages": ' + _NEST + b"}", {}, 400),
    ("no model", b'{"messages": [{"role": "user", "content": "x"}]}', {}, 400),
    ("model number", b'{"model": 7, "messages": []}', {}, 400),
    ("model empty", b'{"model": "", "messages": []}', {}, 400),
    ("model null", b'{"model": null, "messages": []}', {}, 400),
    ("model object", b'{"model": {"$ne": 1}, "messages": []}', {}, 400),
    ("unknown model", b'{"model": "gpt-9", "messages": []}', {}, 404),
    ("messages not a list", b'{"model": "coder", "messages": 5}', {}, 400),
    ("stream not a bool", b'{"model": "coder", "messages": [], "stream": [1]}', {}, 400),
    (
        "stream_options without stream",
        b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], '
        b'"stream_options": {"include_usage": true}}',
        {},
        400,
    ),
    (
        "stream_options not an object",
        b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], "stream": true, '
        b'"stream_options": 5}',
        {},
        400,
    ),
    ("n not an int", b'{"model": "coder", "messages": [], "n": "two"}', {}, 400),
    (
        "huge int",
        b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], '
        b'"max_tokens": 123456789012345678901234567890}',
        {},
        400,
    ),
    (
        "negative max_tokens",
        b'{"model": "coder", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}',
        {},
        400,
    ),
    ("too large", b'{"model": "coder", "pad": "' + b"x" * (MAX_BODY + 10) + b'"}', {}, 413),
    (
        "unknown variant pinned",
        b'{"model": "coder", "messages": []}',
        {b"x-specrouter-variant": b"nope"},
        400,
    ),
    (
        "latin-1 request id",
        b'{"model": "gpt-9", "messages": []}',
        {b"x-request-id": b"caf\xe9"},
        404,
    ),
    ("embedding model on chat", b'{"model": "embedding-small", "messages": []}', {}, 400),
]
