"""`specrouter probe` against a real llama.cpp server: its counters read with the engine's key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.harness.llamacpp import LlamaCppServer
from loadtests.harness.tinymodels import tiny_pair
from loadtests.probe import command as probe

KEY = "probe-test-key"


def test_probe_reads_a_keyed_llamacpp_engine(tmp_path: Path) -> None:
    target, draft = tiny_pair(tmp_path / "models")
    out = tmp_path / "direct.json"
    with LlamaCppServer(target, draft=draft, n_max=8, api_key=KEY, ctx_size=4096) as engine:
        rc = probe.main(["--url", f"{engine.url}/v1", "--key", KEY, "--model", "tiny",
                         "--metrics-url", f"{engine.url}/metrics", "--metrics-key", KEY,
                         "--concurrency", "1", "--repeats", "1", "--temperatures", "0",
                         "--window", "2", "--warmup", "0.5", "--max-tokens", "1500",
                         "--prefill-tokens", "0", "--no-plot", "--quiet", "--out", str(out)])
    assert rc == 0
    text = out.read_text()
    assert KEY not in text  # the key is neither described nor in the recorded argv
    d = json.loads(text)
    assert d["target"]["metrics"] == [{"url": f"{engine.url}/metrics", "kind": "engine",
                                       "backends": None}]
    run = d["runs"][0]
    assert run["errors"] == 0 and run["generated"] > 0 and run["tok_s"] > 0
    # the tiny draft agrees often at temperature 0 (5.7 tokens per step on one answer)
    assert run["tokens_per_step"] == pytest.approx(5.5, abs=2.0)
    assert len(run["accept_per_pos"]) == 8  # one rate per draft position, n_max 8
