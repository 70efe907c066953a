"""The in-process benchmarks run: a few calls of each prints its figures. No bound on them: the
figures belong to the benchmarks (docs/overhead.md, docs/opentelemetry.md)."""

from __future__ import annotations

import re

import pytest

from loadtests.bench import decide, otel


def test_decide_prints_every_scenario_and_its_decision(capsys: pytest.CaptureFixture[str]) -> None:
    assert decide.main(["--calls", "20", "--rounds", "1", "--sessions", "100"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^(.+?)\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s+-> (\S+) \(", out, re.M)
    assert len(rows) == 3, out
    assert all(float(median) > 0 for _, median, _, _ in rows)
    assert re.search(r"^target: median under \d+ us -> (under|OVER)$", out, re.M), out


def test_otel_prints_its_per_request_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert otel.main(["--requests", "3", "--rounds", "1", "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"begin \+ sink on the loop: median [\d.]+ us", out), out
    assert re.search(r"CPU incl\. export threads: median [\d.]+ us .* per chunk", out), out
