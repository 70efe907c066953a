"""The probe's outputs: the table, the JSON results file, the PNG, and `compare`'s side-by-side.

Formatting only: the statistics are in probe_stats, the measurement in probe_run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from loadtests.probe.run import PrefillResult, RunResult
from loadtests.probe.stats import (
    CellKey,
    CompareRow,
    Summary,
    cell_order,
    compare,
    summarize,
    temp_label,
)
from proxy.observe.stats import mean

FORMAT = "specrouter-probe/1"

METRICS = {
    "tok_s": "aggregate decode tokens/s",
    "per_stream_tok_s": "per-stream decode tokens/s",
    "tokens_per_step": "accepted tokens per target step",
    "ttft_p50_ms": "TTFT p50 (ms)",
    "itl_p50_ms": "ITL p50 (ms)",
}


def group(runs: Iterable[RunResult]) -> dict[CellKey, list[RunResult]]:
    out: dict[CellKey, list[RunResult]] = {}
    for r in runs:
        out.setdefault((r.concurrency, r.temperature), []).append(r)
    return {k: out[k] for k in cell_order(out)}


def cell_summaries(runs: Iterable[RunResult], metric: str = "tok_s") -> dict[CellKey, Summary]:
    out: dict[CellKey, Summary] = {}
    for key, rs in group(runs).items():
        s = summarize(getattr(r, metric) for r in rs)
        if s is not None:
            out[key] = s
    return out


def _mean_of(values: Iterable[float | None]) -> float | None:
    return mean([v for v in values if v is not None])


def _per_pos_mean(rs: Sequence[RunResult]) -> list[float]:
    width = max((len(r.accept_per_pos) for r in rs), default=0)
    out: list[float] = []
    for p in range(width):
        m = mean([r.accept_per_pos[p] for r in rs if len(r.accept_per_pos) > p])
        out.append(m if m is not None else 0.0)
    return out


def cell_json(runs: Iterable[RunResult]) -> list[dict[str, Any]]:
    cells: list[dict[str, Any]] = []
    for (n, t), rs in group(runs).items():

        def summ(attr: str, rs: Sequence[RunResult] = rs) -> dict[str, Any] | None:
            s = summarize(getattr(r, attr) for r in rs)
            return None if s is None else asdict(s)

        cells.append(
            {
                "concurrency": n,
                "temperature": t,
                "runs": len(rs),
                "tok_s": summ("tok_s"),
                "per_stream_tok_s": summ("per_stream_tok_s"),
                "tokens_per_step": summ("tokens_per_step"),
                "accept_per_pos": _per_pos_mean(rs),
                "ttft_p50_ms": _mean_of(r.ttft_p50_ms for r in rs),
                "ttft_p95_ms": _mean_of(r.ttft_p95_ms for r in rs),
                "itl_p50_ms": _mean_of(r.itl_p50_ms for r in rs),
                "itl_p95_ms": _mean_of(r.itl_p95_ms for r in rs),
                "chunk_gap_p50_ms": _mean_of(r.chunk_gap_p50_ms for r in rs),
                "chunk_gap_p95_ms": _mean_of(r.chunk_gap_p95_ms for r in rs),
                "errors": sum(r.errors for r in rs),
                "requests": sum(r.requests for r in rs),
            }
        )
    return cells


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.0f}"


def format_table(runs: Sequence[RunResult], title: str = "") -> str:
    """Mean, min-max and run count per cell, with acceptance, latencies and errors."""
    lines = [title] if title else []
    head = (
        f"{'temp':>5} {'N':>3}  {'tokens/s mean':>13} {'min-max':>13} {'runs':>4}  "
        f"{'per stream':>10}  {'tok/step':>8}  {'TTFT p50/p95 ms':>15}  "
        f"{'ITL p50/p95 ms':>14}  {'errors':>6}  acceptance per position (%)"
    )
    lines += [head, "-" * len(head)]
    for (n, t), rs in group(runs).items():
        s = summarize(r.tok_s for r in rs)
        if s is None:
            continue
        rng = f"{s.min:.1f}-{s.max:.1f}" if s.n > 1 else "-"
        ps = summarize(r.per_stream_tok_s for r in rs)
        tps = summarize(r.tokens_per_step for r in rs)
        tps_txt = f"{tps.mean:.2f}" if tps is not None else "-"
        ttft = (
            f"{_ms(_mean_of(r.ttft_p50_ms for r in rs))}/{_ms(_mean_of(r.ttft_p95_ms for r in rs))}"
        )
        itl = f"{_ms(_mean_of(r.itl_p50_ms for r in rs))}/{_ms(_mean_of(r.itl_p95_ms for r in rs))}"
        pos = " ".join(f"{100 * x:.0f}" for x in _per_pos_mean(rs)) or "-"
        errors = sum(r.errors for r in rs)
        lines.append(
            f"{temp_label(t):>5} {n:>3}  {s.mean:>13.1f} {rng:>13} {s.n:>4}  "
            f"{(ps.mean if ps else 0):>10.1f}  {tps_txt:>8}  {ttft:>15}  {itl:>14}  "
            f"{errors:>6}  {pos}"
        )
    lines += split_warnings(runs)
    return "\n".join(lines)


def split_warnings(runs: Sequence[RunResult]) -> list[str]:
    """Runs whose measured requests the gateway sent to more than one variant."""
    out: list[str] = []
    for r in runs:
        if len(r.variants) > 1:
            via = ", ".join(f"{k} x{v}" for k, v in sorted(r.variants.items()))
            out.append(
                f"warning: N={r.concurrency} temp {temp_label(r.temperature)} run "
                f"{r.run + 1}: the measured requests went to several variants ({via}); "
                "the window sums engines (use --warmup-requests so that a load rule "
                "routes them at the steady concurrency)"
            )
    return out


def format_prefill(p: PrefillResult | None) -> str:
    if p is None:
        return "prefill: not measured"
    return (
        f"prefill: {p.prompt_tokens} fresh prompt tokens ({p.source}) in {p.seconds:.2f} s "
        f"to the first token: {p.tok_s:.0f} prompt tokens/s"
    )


# -- the results file -----------------------------------------------------------------------------


@dataclass(slots=True)
class Results:
    label: str
    config: dict[str, Any]
    target: dict[str, Any]
    runs: list[RunResult]
    prefill: PrefillResult | None
    started_at: str
    finished_at: str
    interrupted: bool = False
    stop_reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "label": self.label,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "interrupted": self.interrupted,
            "stop_reason": self.stop_reason,
            "config": self.config,
            "target": self.target,
            "cells": cell_json(self.runs),
            "prefill": asdict(self.prefill) if self.prefill else None,
            "runs": [r.to_json() for r in self.runs],
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)

    @staticmethod
    def load(path: Path) -> Results:
        d = json.loads(path.read_text(encoding="utf-8"))
        if d.get("format") != FORMAT:
            raise ValueError(f"{path}: not a probe results file (format {d.get('format')!r})")
        p = d.get("prefill")
        return Results(
            label=str(d.get("label") or path.stem),
            config=d.get("config") or {},
            target=d.get("target") or {},
            runs=[RunResult.from_json(r) for r in d["runs"]],
            prefill=PrefillResult(**p) if p else None,
            started_at=d.get("started_at", ""),
            finished_at=d.get("finished_at", ""),
            interrupted=bool(d.get("interrupted")),
            stop_reason=d.get("stop_reason", ""),
        )


# -- the picture ----------------------------------------------------------------------------------


def plot(series: Sequence[tuple[str, Sequence[RunResult]]], path: Path, title: str) -> bool:
    """Aggregate decode tokens/s against concurrency, one line per (configuration, temperature),
    the runs' min-max as error bars. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for label, runs in series:
        by_temp: dict[float | None, list[tuple[int, Summary]]] = {}
        for (n, t), s in cell_summaries(runs).items():
            by_temp.setdefault(t, []).append((n, s))
        for t, pts in by_temp.items():
            pts.sort()
            xs = [n for n, _ in pts]
            ys = [s.mean for _, s in pts]
            err = [[s.mean - s.min for _, s in pts], [s.max - s.mean for _, s in pts]]
            name = f"{label}, temp {temp_label(t)}" if label else f"temp {temp_label(t)}"
            ax.errorbar(
                xs,
                ys,
                yerr=err,
                marker="o",
                capsize=3,
                label=name,
                linestyle="-" if t is not None else "--",
            )
    ax.set_xscale("log", base=2)
    all_n = sorted({r.concurrency for _, runs in series for r in runs})
    ax.set_xticks(all_n, [str(n) for n in all_n])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("aggregate decode tokens/s (unscaled)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


# -- compare -------------------------------------------------------------------------------------


def format_compare(labels: Sequence[str], rows: Sequence[CompareRow], metric: str) -> str:
    digits = 2 if metric == "tokens_per_step" else 1
    texts = [s.fmt(digits) for row in rows for s in row.summaries if s is not None]
    width = max(12, *(len(x) + 2 for x in [*labels, *texts]))
    lines = [f"{METRICS.get(metric, metric)}: mean [min-max] xruns; change vs {labels[0]}"]
    head = (
        f"{'temp':>5} {'N':>3}  "
        + "".join(f"{x:<{width}}" for x in labels)
        + "".join(f"{'vs ' + labels[0][:10]:>14}" for _ in labels[1:])
        + "  flags"
    )
    lines += [head, "-" * len(head)]
    for row in rows:
        n, t = row.key
        cells = "".join(f"{(s.fmt(digits) if s else '-'):<{width}}" for s in row.summaries)
        changes = "".join(
            f"{('-' if c.pct is None else f'{c.pct:+.1f} %'):>14}" for c in row.changes
        )
        flags = "; ".join(
            f"{labels[i + 1]}: {', '.join(c.flags)}" if len(labels) > 2 else ", ".join(c.flags)
            for i, c in enumerate(row.changes)
            if c.flags
        )
        lines.append(f"{temp_label(t):>5} {n:>3}  {cells}{changes}  {flags}".rstrip())
    lines.append("")
    lines.append(
        "not separable with these runs: the two cells' min-max ranges overlap. "
        "re-measure: a single-run cell whose change is within the scatter of a single "
        "run (the largest relative range of the multi-run cells at that N), so one more "
        "run could reverse which configuration wins the cell."
    )
    return "\n".join(lines)


def compare_results(
    results: Sequence[Results], metric: str = "tok_s"
) -> tuple[list[str], list[CompareRow]]:
    labels = _unique_labels([r.label for r in results])
    files: list[Mapping[CellKey, Summary]] = [cell_summaries(r.runs, metric) for r in results]
    return labels, compare(files)


def _unique_labels(labels: Sequence[str]) -> list[str]:
    out: list[str] = []
    for i, x in enumerate(labels):
        out.append(x if labels.count(x) == 1 else f"{x}#{i + 1}")
    return out
