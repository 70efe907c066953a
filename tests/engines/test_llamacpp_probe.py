"""`specrouter probe` against a real llama.cpp server: its counters read with the engine's key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.harness.llamacpp import LlamaCppServer
from loadtests.harness.tinymodels import tiny_pair
from loadtests.probe import command as probe
from loadtests.probe.metrics import Reading, parse_engine, window_figures

KEY = "probe-test-key"

LLAMACPP_TEXT = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 989
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 173
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 171
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 816
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 150
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""


def test_parse_engine_reads_llamacpp_counters() -> None:
    r = parse_engine(LLAMACPP_TEXT)
    assert r.get("generation") == 989.0 and r.get("decodes") == 173.0
    assert r.get("drafts") == 171.0 and r.get("accepted") == 816.0
    assert r.per_pos == {0: 150.0}
    assert r.get("running") == 1.0 and r.get("waiting") == 2.0
    w = window_figures(Reading(), r, 2.0)
    # Not 1 + 816 / 171: llama.cpp drew no draft on 2 of its 173 steps. It has no count of
    # first tokens, so the answer's first token and its step stay in (988 / 172 by the
    # definition, 0.5 % higher on this 989-token answer).
    assert w.tokens_per_step == pytest.approx(989 / 173) and w.tok_s == 494.5


def test_probe_reads_a_keyed_llamacpp_engine(tmp_path: Path) -> None:
    target, draft = tiny_pair(tmp_path / "models")
    out = tmp_path / "direct.json"
    with LlamaCppServer(target, draft=draft, n_max=8, api_key=KEY, ctx_size=4096) as engine:
        rc = probe.main(
            [
                "--url",
                f"{engine.url}/v1",
                "--key",
                KEY,
                "--model",
                "tiny",
                "--metrics-url",
                f"{engine.url}/metrics",
                "--metrics-key",
                KEY,
                "--concurrency",
                "1",
                "--repeats",
                "1",
                "--temperatures",
                "0",
                "--window",
                "2",
                "--warmup",
                "0.5",
                "--max-tokens",
                "1500",
                "--prefill-tokens",
                "0",
                "--no-plot",
                "--quiet",
                "--out",
                str(out),
            ]
        )
    assert rc == 0
    text = out.read_text()
    assert KEY not in text  # the key is neither described nor in the recorded argv
    d = json.loads(text)
    assert d["target"]["metrics"] == [
        {"url": f"{engine.url}/metrics", "kind": "engine", "backends": None}
    ]
    run = d["runs"][0]
    assert run["errors"] == 0 and run["generated"] > 0 and run["tok_s"] > 0
    # the tiny draft agrees often at temperature 0 (5.7 tokens per step on one answer)
    assert run["tokens_per_step"] == pytest.approx(5.5, abs=2.0)
    assert len(run["accept_per_pos"]) == 8  # one rate per draft position, n_max 8
