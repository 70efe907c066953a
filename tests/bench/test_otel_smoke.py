"""The OpenTelemetry benchmark runs: a few requests print its per-request figures. No bound on
them: the figures belong to the benchmark (docs/opentelemetry.md)."""

from __future__ import annotations

import re

import pytest

from loadtests.bench import otel


def test_otel_prints_its_per_request_figures(capsys: pytest.CaptureFixture[str]) -> None:
    assert otel.main(["--requests", "3", "--rounds", "1", "--tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"begin \+ sink on the loop: median [\d.]+ us", out), out
    assert re.search(r"CPU incl\. export threads: median [\d.]+ us .* per chunk", out), out
