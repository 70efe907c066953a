"""The KV-sessions workload's premise, without an engine: its text counts as asked in the
simulator's tokenizer and runs about 4 bytes a token in the request, as the gateway's estimate of
an uncounted prompt assumes (policies/admission.py), so admission sizes first turns right."""

from __future__ import annotations

import random

import orjson

from loadtests.bench.kv_sessions import KvSession, KvWorkload, text
from loadtests.replay.workload import request_body
from loadtests.sim.textgen import split_pieces
from policies.admission import BYTES_PER_TOKEN


def test_text_counts_as_asked() -> None:
    for tokens in (130, 1300):
        n = len(split_pieces(text(random.Random(tokens), tokens)))
        assert abs(n - tokens) <= 0.05 * tokens + 12, (tokens, n)


def test_a_first_prompt_runs_about_the_gateways_bytes_per_token() -> None:
    workload = KvWorkload()
    turn = KvSession(workload, 0).next_turn()
    _, body = request_body(turn, workload.params())
    tokens = sum(len(split_pieces(m["content"])) for m in turn.messages)
    per_token = len(orjson.dumps(body)) / tokens
    assert abs(per_token - BYTES_PER_TOKEN) < 0.5, per_token
