"""The simulator's SGLang Messages and Responses bytes against SGLang 0.5.23's own
(tests/fixtures/sglang-golden/, `messages_*`, `responses_*`): each fixture's engine outputs
through loadtests/sim/sglang_typed_wire.py give the frozen stream or body byte for byte."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from loadtests.sim import sglang_typed_wire as w

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-golden" / "0.5.23"
HEX = "0123456789abcdef0123456789abcdef"  # the fixtures' pinned uuid4
CREATED, MODEL, PROMPT = 1780000000, "qwen-tiny", 12


def _case(name: str) -> tuple[dict[str, Any], list[str], str, int]:
    """The request, the text of each engine output, the finish and the completion tokens."""
    case = orjson.loads((GOLDEN / f"{name}.input.json").read_bytes())
    outputs, texts, sent = case["outputs"], [], ""
    for o in outputs:
        texts.append(o["text"][len(sent) :])
        sent = o["text"]
    last = outputs[-1]["meta_info"]
    return case["request"], texts, last["finish_reason"]["type"], last["completion_tokens"]


def test_messages_stream() -> None:
    _, texts, finish, tokens = _case("messages_stream")
    s = w.MessagesStream(f"msg_{HEX}", MODEL, PROMPT)
    out = b"".join(b"".join(s.delta(t)) for t in texts) + b"".join(s.end(finish, tokens))
    assert out == (GOLDEN / "messages_stream.sse").read_bytes()


def test_messages_body() -> None:
    _, texts, finish, tokens = _case("messages_full")
    body = w.message_body(f"msg_{HEX}", MODEL, "".join(texts), finish, PROMPT, tokens)
    assert orjson.dumps(body) == (GOLDEN / "messages_full.json").read_bytes()


def test_responses_stream() -> None:
    request, texts, finish, tokens = _case("responses_stream")
    s = w.ResponsesStream(request, f"resp_{HEX}", f"msg_{HEX}", CREATED, MODEL)
    out = b"".join(s.start())
    out += b"".join(b"".join(s.delta(t)) for t in texts)
    out += b"".join(s.end(finish, PROMPT, tokens))
    assert out == (GOLDEN / "responses_stream.sse").read_bytes()


def test_responses_body() -> None:
    request, texts, finish, tokens = _case("responses_full")
    body = w.responses_body(
        request,
        f"resp_{HEX}",
        f"msg_{HEX}",
        CREATED,
        MODEL,
        "".join(texts),
        finish=finish,
        prompt=PROMPT,
        output=tokens,
    )
    assert orjson.dumps(body) == (GOLDEN / "responses_full.json").read_bytes()
