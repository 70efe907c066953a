"""`specrouter probe pair` against two simulated engines of one device (the model's overlap)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtests.harness.device import DeviceSim
from loadtests.probe.pair import overlap_from


def test_overlap_from_the_slowdown() -> None:
    assert overlap_from(40.0, 20.0) == 0.0  # serialised: half the rate
    assert overlap_from(40.0, 40.0) == 1.0
    assert overlap_from(40.0, 80.0 / 3) == pytest.approx(0.5)
    assert overlap_from(40.0, 10.0) == 0.0  # clamped
    assert overlap_from(0.0, 10.0) is None


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [0.0, 0.6])
def test_pair_recovers_the_simulated_overlap(overlap: float, tmp_path: Path) -> None:
    engines = [("a", "mtp3", None), ("b", "mtp3", None)]
    with DeviceSim(engines, time_scale=0.1, overlap=overlap) as dev:
        out = tmp_path / "pair.json"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy.cli",
                "probe",
                "pair",
                "--a",
                dev.urls["a"],
                "--b",
                dev.urls["b"],
                "--concurrency",
                "3",
                "--window",
                "12",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=90,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(out.read_text())
    assert result["time_scale"] == {"a": 0.1, "b": 0.1}
    assert result["overlap"] == pytest.approx(overlap, abs=0.2)
    for e in result["engines"].values():
        assert e["slowdown"] == pytest.approx(2.0 - overlap, rel=0.15)
