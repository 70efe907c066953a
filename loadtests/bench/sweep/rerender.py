"""Re-renders a finished sweep's Markdown and PNG from its sweep.json (the figures, the verdicts
and the paired ratios), without running anything: `python -m loadtests.bench.sweep.rerender DIR`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from . import matched, paired
from .plot import plot
from .table import markdown
from .verdict import aggregate, verdicts


def render(doc: dict[str, Any], png: Path | None = None, runs: Path | None = None) -> str:
    records = doc["runs"]
    order = list(doc["configs"])
    machines = {name: c["machines"] for name, c in doc["configs"].items()}
    agg = aggregate(records)
    text = markdown(agg, verdicts(agg, machines), order, doc["premises"])
    for metric in ("turn_p50", "turn_p95"):
        text += "\n" + paired.markdown(paired.ratios(records, metric), order, metric)
    if runs is not None and runs.is_dir():
        text += "\n" + matched.markdown(matched.table(runs), order)
    if png is not None and agg:
        plot(agg, order, png, "specrouter sweep")
    return text


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m loadtests.bench.sweep.rerender DIR", file=sys.stderr)
        return 2
    out = Path(args[0])
    doc = json.loads((out / "sweep.json").read_text())
    text = render(doc, out / "sweep.png", out / "runs")
    (out / "sweep.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
