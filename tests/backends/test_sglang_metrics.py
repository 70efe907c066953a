"""SGLang's /metrics as the gateway scrapes it, on the page SGLang 0.5.23's own collectors wrote
(tests/fixtures/sglang-golden/0.5.23/metrics.prom: two finished requests of 8 tokens, 3 verify
steps each; 2 running and 1 waiting with priority scheduling on)."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.backends.health import EngineWindow, Scrape, parse_metrics

PAGE = (
    Path(__file__).resolve().parent.parent
    / "fixtures"
    / "sglang-golden"
    / "0.5.23"
    / "metrics.prom"
)


def test_sglang_page_read_onto_the_live_keys() -> None:
    scrape = parse_metrics(PAGE.read_text(), 5.0, "sglang")
    # Totals only: the per-priority queue counts and per-source cached tokens are not added in.
    assert scrape.values == {
        "running": 2.0,
        "waiting": 1.0,
        "kv_usage": 0.25,
        "drafts": 6.0,
        "generation_tokens": 16.0,
        "first_tokens": 2.0,
        "prefix_queries": 24.0,
        "prefix_hits": 8.0,
    }
    assert scrape.accepted_per_pos == {}


def test_window_tokens_per_step_match_the_per_request_figure() -> None:
    """(Δgenerated - Δfinished) / Δverify calls: the per-request (8 - 1) / 3 of both requests."""
    window = EngineWindow()
    zero = dict.fromkeys(("drafts", "generation_tokens", "first_tokens"), 0.0)
    window.add(Scrape(0.0, zero))
    window.add(parse_metrics(PAGE.read_text(), 5.0, "sglang"))
    assert window.acceptance(60.0) == pytest.approx(7 / 3)
