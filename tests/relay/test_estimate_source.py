"""Where the gateway puts back what it moved (0.28 and 0.33 chunk shapes), and when its
tokens-per-step estimate is withheld (proxy/relay/measure.py)."""

from __future__ import annotations

import pytest

from proxy.record.measure import Measurement
from proxy.relay.measure import StreamFilter, withhold_estimate

_USAGE = b'"usage":{"prompt_tokens":5,"total_tokens":%d,"completion_tokens":%d}'
_FP = b'"system_fingerprint":"vllm-0.33.0-d68afdc4"'


def _chunk(text: bytes, total: int, *, finish: bool, kv: bool) -> bytes:
    reason = b'"stop","stop_reason":null' if finish else b"null"
    out = (
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"'
        + text
        + b'"},"logprobs":null,"finish_reason":'
        + reason
        + b"}],"
        + _USAGE % (5 + total, total)
    )
    return out + (b',"kv_transfer_params":null}\n\n' if kv else b"}\n\n")


def _usage_chunk(total: int) -> bytes:
    return b'data: {"id":"c","choices":[],' + _USAGE % (5 + total, total) + b"," + _FP + b"}\n\n"


@pytest.mark.parametrize("kv", [False, True], ids=["0.28", "0.33"])
def test_fingerprint_goes_where_the_version_puts_it(kv: bool) -> None:
    m = Measurement(0.0)
    filt = StreamFilter(m, strip_usage=True, drop_usage_chunk=True)
    out = filt.frame(_chunk(b"a", 1, finish=False, kv=kv), 0.1)
    assert filt.frame(_chunk(b"b", 2, finish=True, kv=kv), 0.2) == b""  # held for the fingerprint
    out += filt.frame(_usage_chunk(2), 0.3)
    tail = b',"kv_transfer_params":null}' if kv else b"}"
    assert out.endswith(b'"finish_reason":"stop","stop_reason":null}],' + _FP + tail + b"\n\n")
    assert b'"usage"' not in out


def _relay(m: Measurement, tokens: list[int]) -> None:
    filt = StreamFilter(m)
    total = 0
    for i, n in enumerate(tokens):
        total += n
        filt.frame(_chunk(b"x", total, finish=i == len(tokens) - 1, kv=False), 0.1 * (i + 1))


def test_estimate_kept_when_every_chunk_is_one_step() -> None:
    m = Measurement(0.0)
    withhold_estimate(m, {"stream": True}, 7)
    _relay(m, [1, 8, 3, 1])
    assert m.tps_source == "chunks" and m.accepted_and_steps == (12 - 3, 3)
    unknown = Measurement(0.0)  # no speculative config in the policy: no limit to check
    withhold_estimate(unknown, {"stream": True}, None)
    _relay(unknown, [2, 20])
    assert unknown.estimate_void is None and unknown.tps_source == "chunks"


@pytest.mark.parametrize(
    ("k", "tokens"), [(7, [1, 9, 2]), (3, [2, 1])], ids=["over-k+1", "first-chunk"]
)
def test_estimate_withheld_on_merged_chunks(k: int, tokens: list[int]) -> None:
    m = Measurement(0.0)
    withhold_estimate(m, {"stream": True}, k)
    _relay(m, tokens)
    assert m.estimate_void == "merged"
    assert m.tps_source is None and m.acceptance is None and m.accepted_and_steps is None


def test_estimate_withheld_with_a_client_stream_interval_engine_summary_kept() -> None:
    m = Measurement(0.0)
    withhold_estimate(m, {"stream": True, "stream_interval": 4}, 7)
    _relay(m, [1, 4, 4])
    assert m.estimate_void == "stream_interval" and m.tps_source is None
    m.spec = {"num_accepted_draft_tokens": 5, "num_spec_steps": 3, "mean_acceptance_length": 2.67}
    assert m.tps_source == "engine" and m.accepted_and_steps == (5, 3)  # 8 tokens after the first
    one = Measurement(0.0)
    withhold_estimate(one, {"stream": True, "stream_interval": 1}, 7)
    assert one.estimate_void is None
