"""The README documents the metrics as they are defined (proxy/observe/metrics.py is the source)."""

from __future__ import annotations

from pathlib import Path

from proxy.observe.metrics import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_metrics_table_is_current() -> None:
    text = README.read_text()
    assert markdown_table() in text, "regenerate with `python -m proxy.observe.metrics`"


def test_readme_opens_with_the_two_commands() -> None:
    head = README.read_text()[:1500]
    assert "make demo" in head and "make test" in head
