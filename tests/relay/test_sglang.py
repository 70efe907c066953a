"""SGLang engines, checked against SGLang 0.5.23's own serving bytes
(tests/fixtures/sglang-golden/): what the gateway asks for (continuous usage, spec details) is
cut out again, so the client gets SGLang's answer to its own request byte for byte, and tokens
per step come from SGLang's `spec_verify_ct` by the one definition."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from policies.types import Endpoint
from proxy.record.measure import Measurement
from proxy.relay import sglang
from proxy.relay.measure import StreamFilter, read_body
from proxy.relay.rewrite import plan_usage
from proxy.relay.sglang_stream import BodyCut

GOLDEN = Path(__file__).resolve().parent.parent / "fixtures" / "sglang-golden" / "0.5.23"
# The playback's answer: 8 tokens, the first from the prefill, 7 over 3 verify steps.
TOKENS, STEPS = 8, 3


def frames(name: str) -> list[bytes]:
    data = (GOLDEN / f"{name}.sse").read_bytes()
    return [f + b"\n\n" for f in data.split(b"\n\n") if f]


def request(name: str) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads((GOLDEN / f"{name}.input.json").read_bytes())["request"]
    return body


def relay(endpoint: Endpoint, client: dict[str, Any], asked: str) -> tuple[bytes, Measurement]:
    """The asked stream through the gateway's reading for the client's request: SGLang's spec
    frame read and cut, then the usage the client did not ask for (StreamFilter), then
    completions' `"usage":null` put back."""
    usage = plan_usage(client, endpoint, "sglang")
    assert usage.injected
    m = Measurement(0.0, stream=True)
    filt = StreamFilter(m, strip_usage=usage.strip_usage, drop_usage_chunk=usage.drop_usage_chunk)
    out = b""
    for i, frame in enumerate(frames(asked)):
        spec = sglang.frame_spec(frame)
        if spec is not None:
            m.spec = spec
        frame = sglang.strip_frame(frame)
        if frame:
            out += sglang.null_usage(filt.frame(frame, float(i + 1)))
    return out + sglang.null_usage(filt.release()), m


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("client", ["stream_plain", "stream_usage"])
def test_the_client_gets_sglangs_bytes_for_its_own_request(endpoint: Endpoint, client: str) -> None:
    name = f"{endpoint}_{client}"
    out, m = relay(endpoint, request(name), f"{endpoint}_stream_asked")
    assert out == (GOLDEN / f"{name}.sse").read_bytes()
    assert m.completion_tokens == TOKENS
    assert m.t_first_token == (2.0 if endpoint == "chat" else 1.0)  # chat opens with a role frame
    assert (m.tps_source, m.acceptance) == ("engine", pytest.approx((TOKENS - 1) / STEPS))


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bodies_measured_from_sglext_and_cut_back(endpoint: str) -> None:
    asked = (GOLDEN / f"{endpoint}_full_asked.json").read_bytes()
    assert sglang.strip_body(asked) == (GOLDEN / f"{endpoint}_full_plain.json").read_bytes()
    m = Measurement(0.0)
    read_body(m, asked)
    assert m.completion_tokens == TOKENS
    assert m.spec == {"num_spec_steps": 3, "num_accepted_draft_tokens": 4, "num_draft_tokens": 9}
    assert (m.tps_source, m.acceptance) == ("engine", pytest.approx((TOKENS - 1) / STEPS))


def test_a_client_that_asked_itself_keeps_its_figures() -> None:
    assert sglang.ask({"return_spec_tokens_details": False}) == {}
    assert sglang.ask({}) == {"return_spec_tokens_details": True}


def test_other_sglext_members_stay() -> None:
    ext = b'"sglext":{"cached_tokens_details":{"device":3},"spec_tokens_details":{"spec_verify_ct":2}}'
    body = b'{"id":"x","choices":[],' + ext + b"}"
    assert (
        sglang.strip_body(body)
        == b'{"id":"x","choices":[],"sglext":{"cached_tokens_details":{"device":3}}}'
    )
    frame = b'data: {"id":"x","choices":[],"usage":null,' + ext + b"}\n\n"
    assert sglang.strip_frame(frame) == (
        b'data: {"id":"x","choices":[],"usage":null,"sglext":{"cached_tokens_details":{"device":3}}}\n\n'
    )


@pytest.mark.parametrize(
    "details",
    [None, {}, {"spec_verify_ct": 0, "spec_num_correct_drafts": 0}, {"spec_verify_ct": "3"}],
)
def test_no_verify_step_or_no_count_gives_no_figure(details: Any) -> None:
    assert sglang.spec_of({"sglext": {"spec_tokens_details": details}}) is None


def test_no_spec_when_sglang_did_not_speculate() -> None:
    out, m = relay("chat", request("chat_stream_plain"), "chat_stream_plain")
    assert out == (GOLDEN / "chat_stream_plain.sse").read_bytes()
    assert m.spec is None


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
@pytest.mark.parametrize("piece", [1, 7, 11, 64, 1 << 20])
def test_a_body_cut_as_it_passes_in_pieces(endpoint: str, piece: int) -> None:
    """Whatever the engine's reads split (the key `,"sglext":{` across two of them), the client
    gets SGLang's body for its own request, and nothing before the extension waits for it."""
    asked = (GOLDEN / f"{endpoint}_full_asked.json").read_bytes()
    cut = BodyCut()
    out = [cut.feed(asked[i : i + piece]) for i in range(0, len(asked), piece)]
    assert b"".join(out) + cut.end() == (GOLDEN / f"{endpoint}_full_plain.json").read_bytes()
    assert len(b"".join(out)) == asked.find(b',"sglext"')  # only the extension waited


def test_a_body_without_the_extension_passes_whole() -> None:
    plain = (GOLDEN / "chat_full_plain.json").read_bytes()
    cut = BodyCut()
    assert (
        b"".join(cut.feed(plain[i : i + 5]) for i in range(0, len(plain), 5)) + cut.end() == plain
    )
