"""The chunk-estimate benchmark runs: `--quick` (one cell, 1 stream, no merging model) prints
its cell with a finite error against the simulator's own counts. No bound on the error: the
figure belongs to the benchmark (docs/estimate.md)."""

from __future__ import annotations

import math
import re

import pytest

from loadtests.bench.estimate import main

_ROW = re.compile(
    r"^\| (\d+) \| (off|[\d.]+ ms/chunk) \| (\d+) \((\d+)\) \| (\d+)% \| ([-+\d.]+)% \| ([-+\d.]+)% \|$"
)


def test_quick_run_prints_its_cell_with_a_finite_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick", "--max-tokens", "48"]) == 0
    out = capsys.readouterr().out
    rows = [m.groups() for line in out.splitlines() if (m := _ROW.match(line))]
    assert len(rows) == 1, out
    streams, merging, requests, _rounds, withheld, abs_err, signed = rows[0]
    assert (streams, merging, withheld) == ("1", "off", "0")
    assert int(requests) == 2
    assert math.isfinite(float(abs_err)) and math.isfinite(float(signed))
    assert abs(float(signed)) <= float(abs_err) + 1e-9
