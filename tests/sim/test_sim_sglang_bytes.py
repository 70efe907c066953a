"""The simulator's SGLang frames against SGLang 0.5.23's own bytes (tests/fixtures/sglang-golden/):
each fixture's engine outputs (its `.input.json`) through loadtests/sim/sglang_wire.py give the
frozen stream or body byte for byte, and the metrics page parses to the families the gateway
reads, as the frozen page does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadtests.sim import sglang_wire
from policies.capabilities import SglangFamily as F
from proxy.backends.health import parse_metrics

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "sglang-golden" / "0.5.23"
K = 3  # the fixtures' drafter: 3 tokens a step


def _case(name: str) -> tuple[dict[str, Any], list[dict[str, Any]], bool]:
    case = orjson.loads((GOLDEN / f"{name}.input.json").read_bytes())
    return case["request"], case["outputs"], case["endpoint"] == "chat"


def _details(request: dict[str, Any], last: dict[str, Any]) -> dict[str, Any] | None:
    if request.get("return_spec_tokens_details") is not True:
        return None
    m = last["meta_info"]
    steps, correct = m["spec_verify_ct"], m["spec_num_correct_drafts"]
    return sglang_wire.spec_details(m["completion_tokens"], steps, correct, steps * K, K)


def _frames(chat: bool) -> sglang_wire.Frames:
    return sglang_wire.Frames(
        request_id="0123456789abcdef0123456789abcdef",
        created=1780000000,
        model="qwen-tiny",
        chat=chat,
        prompt_tokens=12,
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("shape", ["plain", "usage", "asked"])
def test_streams_are_sglangs_bytes(endpoint: str, shape: str) -> None:
    name = f"{endpoint}_stream_{shape}"
    request, outputs, chat = _case(name)
    opts = request.get("stream_options") or {}
    frames, out, sent = _frames(chat), b"", ""
    for o in outputs:
        finish = o["meta_info"]["finish_reason"]
        kind = None if finish is None else finish["type"]
        steps = frames.step(
            0,
            o["text"][len(sent) :],
            o["meta_info"]["completion_tokens"],
            kind,
            None,
            continuous=bool(opts.get("continuous_usage_stats")),
        )
        out += b"".join(steps)
        sent = o["text"]
    total = outputs[-1]["meta_info"]["completion_tokens"]
    out += b"".join(
        frames.tail(total, _details(request, outputs[-1]), bool(opts.get("include_usage")))
    )
    assert out == (GOLDEN / f"{name}.sse").read_bytes()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("shape", ["plain", "asked"])
def test_bodies_are_sglangs_bytes(endpoint: str, shape: str) -> None:
    name = f"{endpoint}_full_{shape}"
    request, outputs, chat = _case(name)
    last = outputs[-1]
    obj = sglang_wire.body(
        request_id="0123456789abcdef0123456789abcdef",
        created=1780000000,
        model="qwen-tiny",
        chat=chat,
        choices=[(last["text"], last["meta_info"]["finish_reason"]["type"], None)],
        prompt_tokens=12,
        completion_tokens=last["meta_info"]["completion_tokens"],
        details=_details(request, last),
    )
    assert orjson.dumps(obj) == (GOLDEN / f"{name}.json").read_bytes()


def test_metrics_page_reads_as_sglangs() -> None:
    """The same figures on the simulator's page read as on SGLang's own (the fixture's totals),
    under the families, types and labels SGLang writes."""
    figures = {
        F.RUNNING: 2.0,
        F.WAITING: 1.0,
        F.KV_USAGE: 0.25,
        F.SPEC_VERIFY_CALLS: 6.0,
        F.GENERATION_TOKENS: 16.0,
        F.REQUESTS: 2.0,
        F.PROMPT_TOKENS: 24.0,
        F.CACHED_TOKENS: 8.0,
    }
    page = sglang_wire.metrics_page("qwen-tiny", figures).decode()
    theirs = (GOLDEN / "metrics.prom").read_text()
    assert parse_metrics(page, 5.0, "sglang").values == parse_metrics(theirs, 5.0, "sglang").values
    kinds = {f.name: f for f in text_string_to_metric_families(theirs)}
    for family in text_string_to_metric_families(page):
        assert family.type == kinds[family.name].type, family.name
        labels = {tuple(sorted(s.labels)) for s in kinds[family.name].samples}
        assert {tuple(sorted(s.labels)) for s in family.samples} <= labels, family.name
