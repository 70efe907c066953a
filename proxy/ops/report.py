"""`specrouter report`: which configuration is faster for the traffic we actually have.

Reads the request log (proxy/observe/requestlog.py) and prints, per group (variant, temperature,
concurrency, ...), the request count, mean and p5–p95 spread of TTFT, ITL, tokens per step and
decode tokens/s, and each group's difference from the largest group. Every figure carries its
count and spread, and a difference is flagged when it cannot be told apart from the spread
("not separable") or rests on fewer than three requests ("too few"): a single run is not a
measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from proxy.observe.stats import quantile
from proxy.ops.places import demo_state

DB_NAME = "requests.sqlite3"
MIN_RUNS = 3  # fewer requests than this in a group: its figures are anecdotes

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Metric:
    column: str
    title: str
    unit: str
    scale: float  # display = value * scale
    digits: int


METRICS: tuple[Metric, ...] = (
    Metric("ttft_s", "TTFT", "ms", 1000.0, 1),
    Metric("itl_p50_s", "ITL p50", "ms", 1000.0, 2),
    Metric("itl_p95_s", "ITL p95", "ms", 1000.0, 2),
    Metric("tokens_per_step", "tokens per step", "", 1.0, 2),
    Metric("decode_tokens_per_s", "decode tokens/s", "", 1.0, 1),
)


# --- statistics: pure functions -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stats:
    n: int
    mean: float | None
    p5: float | None
    p95: float | None


@dataclass(frozen=True, slots=True)
class Comparison:
    diff: float | None  # mean - reference mean
    rel: float | None  # diff / reference mean
    note: str  # "reference", "too few", "not separable" or ""


def summarize(values: Iterable[float | None]) -> Stats:
    """Count, mean and p5–p95 of the values present (None: the request had no such figure)."""
    ordered = sorted(v for v in values if v is not None)
    if not ordered:
        return Stats(0, None, None, None)
    return Stats(
        len(ordered),
        sum(ordered) / len(ordered),
        quantile(ordered, 0.05, presorted=True),
        quantile(ordered, 0.95, presorted=True),
    )


def overlaps(a: Stats, b: Stats) -> bool:
    """Whether the p5–p95 ranges of a and b share any value."""
    if a.p5 is None or a.p95 is None or b.p5 is None or b.p95 is None:
        return False
    return a.p5 <= b.p95 and b.p5 <= a.p95


def compare(stats: Stats, ref: Stats, *, is_ref: bool = False) -> Comparison:
    """The group's difference from the reference group, with what it is worth."""
    if is_ref:
        return Comparison(None, None, "reference")
    if stats.mean is None or ref.mean is None:
        return Comparison(None, None, "too few" if stats.n < MIN_RUNS else "")
    diff = stats.mean - ref.mean
    rel = diff / ref.mean if ref.mean != 0 else None
    if stats.n < MIN_RUNS or ref.n < MIN_RUNS:
        note = "too few"
    elif overlaps(stats, ref):
        note = "not separable"
    else:
        note = ""
    return Comparison(diff, rel, note)


_BUCKETS: tuple[tuple[int, str], ...] = ((1, "1"), (2, "2"), (4, "3–4"), (8, "5–8"), (16, "9–16"))


def concurrency_bucket(concurrency: int | None) -> str:
    """Concurrency grouped like the facts' probes: 1, 2, 3–4, 5–8, 9–16, 17+."""
    if concurrency is None or concurrency < 1:
        return "?"  # rejected before a backend was chosen
    for upper, label in _BUCKETS:
        if concurrency <= upper:
            return label
    return "17+"


def temperature_label(temperature: float | None, defaulted: bool | int | None) -> str:
    """The effective temperature; '(default)' when the gateway injected it, not the client."""
    if temperature is None:
        return "unset"
    label = f"{temperature:g}"
    return f"{label} (default)" if defaulted else label


_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_since(text: str) -> float:
    """'90s', '30m', '22h', '7d', '2w' (or plain seconds) -> seconds."""
    match = _SINCE.match(text.lower())
    if match is None:
        raise ValueError(f"not a duration: {text!r} (try 30m, 22h, 7d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


# How each --by key turns a row into a group label.
GROUP_KEYS: dict[str, Callable[[Row], str]] = {
    "variant": lambda r: r["variant"] or "(none)",
    "temperature": lambda r: temperature_label(r["temperature"], r["temperature_defaulted"]),
    "concurrency": lambda r: concurrency_bucket(r["concurrency"]),
    "route": lambda r: r["route"] or "(none)",
    "client": lambda r: r["client"],
    "reason": lambda r: r["reason"] or "(none)",
    "canary": lambda r: "canary" if r["canary"] else "baseline",
    "content_class": lambda r: r["content_class"] or "(none)",
    "policy_version": lambda r: r["policy_version"] or "(none)",
    "finish_reason": lambda r: r["finish_reason"] or "(none)",
    "session": lambda r: _column(r, "session"),
    "agent": lambda r: _column(r, "agent"),
    # the engine that began a stream another variant finished (rows before version 3: none)
    "continued_from": lambda r: r.get("continued_from") or "(none)",
    # the agents' own signals (rows before version 5: none)
    "request_class": lambda r: _column(r, "request_class"),
    "agent_type": lambda r: _column(r, "agent_type"),
    "compaction": lambda r: _column(r, "compaction"),
    "context_compacted": lambda r: _flag(r.get("context_compacted"), "compacted", "not compacted"),
    "prompt_id": lambda r: _column(r, "prompt_id"),
    "turn_id": lambda r: _column(r, "turn_id"),
    "turn_state": lambda r: _column(r, "turn_state"),
    "adapted": lambda r: _column(r, "adapted"),  # proxy/relay/adapt.py's rules
    # a session turn's lost prefix (proxy/backends/prefix.py; rows before version 7: none)
    "loss_cause": lambda r: _column(r, "loss_cause"),
    "loss_where": lambda r: _column(r, "loss_where"),
}


def _flag(value: int | None, yes: str, no: str) -> str:
    return "(none)" if value is None else (yes if value else no)


def _column(row: Row, name: str) -> str:
    # a log written before the column existed has none: its rows form one group
    return row.get(name) or "(none)"


def group_rows(rows: Iterable[Row], keys: Sequence[str]) -> list[tuple[tuple[str, ...], list[Row]]]:
    """Rows grouped by the keys' labels, largest group first (it is the reference)."""
    groups: dict[tuple[str, ...], list[Row]] = {}
    for row in rows:
        groups.setdefault(tuple(GROUP_KEYS[k](row) for k in keys), []).append(row)
    return sorted(groups.items(), key=lambda item: (-len(item[1]), item[0]))


@dataclass(frozen=True, slots=True)
class MetricReport:
    stats: Stats
    comparison: Comparison


@dataclass(frozen=True, slots=True)
class GroupReport:
    key: dict[str, str]
    requests: int  # outcome ok: the ones the figures describe
    failed: int  # any other outcome (rejected, upstream_error, client_gone, timeout)
    metrics: dict[str, MetricReport]
    prefix: dict[str, int] = field(default_factory=dict)  # `prefix_of`


def prefix_of(rows: Iterable[Row]) -> dict[str, int]:
    """The session turns compared with their previous turn (proxy/backends/prefix.py): how
    many, the prefix tokens they should have found cached, those lost, and lost by cause."""
    out = {"turns": 0, "expected": 0, "lost": 0}
    for r in rows:
        if r.get("expected_tokens") is None:
            continue
        lost = r.get("lost_tokens") or 0
        out["turns"] += 1
        out["expected"] += r["expected_tokens"]
        out["lost"] += lost
        if lost:
            cause = "lost_" + (r.get("loss_cause") or "unknown")
            out[cause] = out.get(cause, 0) + lost
    return out


def build_report(rows: Sequence[Row], keys: Sequence[str]) -> list[GroupReport]:
    """Per group: figures from its successful requests, compared with the largest group."""
    ok = [r for r in rows if r["outcome"] == "ok"]
    failed: dict[tuple[str, ...], int] = {}
    for _, group in group_rows((r for r in rows if r["outcome"] != "ok"), keys):
        failed[tuple(GROUP_KEYS[k](group[0]) for k in keys)] = len(group)
    grouped = group_rows(ok, keys)
    stats = [
        {m.column: summarize(r[m.column] for r in group) for m in METRICS} for _, group in grouped
    ]
    out = []
    for i, (label, group) in enumerate(grouped):
        metrics = {
            col: MetricReport(s, compare(s, stats[0][col], is_ref=i == 0))
            for col, s in stats[i].items()
        }
        out.append(
            GroupReport(
                dict(zip(keys, label, strict=True)),
                len(group),
                failed.pop(label, 0),
                metrics,
                prefix_of(group),
            )
        )
    for label, n in failed.items():  # groups where nothing succeeded still show up
        out.append(
            GroupReport(
                dict(zip(keys, label, strict=True)),
                0,
                n,
                {
                    m.column: MetricReport(
                        Stats(0, None, None, None), Comparison(None, None, "too few")
                    )
                    for m in METRICS
                },
            )
        )
    return out


# --- reading the log ----------------------------------------------------------------------------


def load_rows(db: Path, since_s: float | None, now: float | None = None) -> list[Row]:
    """Rows of the last since_s seconds (all when None), read-only: the gateway keeps writing."""
    conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
    try:
        conn.row_factory = sqlite3.Row
        if since_s is None:
            cur = conn.execute("SELECT * FROM requests ORDER BY time")
        else:
            start = (time.time() if now is None else now) - since_s
            cur = conn.execute("SELECT * FROM requests WHERE time >= ? ORDER BY time", (start,))
        return [dict(r) for r in cur]
    finally:
        conn.close()


# --- output -------------------------------------------------------------------------------------


def _fmt(value: float | None, m: Metric) -> str:
    return "–" if value is None else f"{value * m.scale:.{m.digits}f}"


def _fmt_diff(c: Comparison, m: Metric) -> str:
    if c.diff is None:
        return ""
    text = f"{c.diff * m.scale:+.{m.digits}f}"
    return text if c.rel is None else f"{text} ({c.rel:+.1%})"


def _label(g: GroupReport) -> str:
    return " ".join(f"{k}={v}" for k, v in g.key.items())


def format_text(groups: Sequence[GroupReport], *, header: Sequence[str]) -> str:
    lines = list(header)
    if not groups:
        return "\n".join([*lines, "no requests in this window"])
    width = max(len("group"), *(len(_label(g)) for g in groups))
    lines += ["", "groups (largest first: the first is the reference)"]
    lines += [f"  {_label(g):<{width}}  {g.requests:>6} ok  {g.failed:>6} failed" for g in groups]
    if any(g.prefix.get("turns") for g in groups):
        lines += ["", "prefix cache: session turns, tokens they should have found, lost (by cause)"]
        for g in groups:
            p = g.prefix
            causes = ", ".join(f"{k[5:]} {v:,}" for k, v in sorted(p.items()) if k[:5] == "lost_")
            lines.append(
                f"  {_label(g):<{width}}  {p.get('turns', 0):>6} turns  {p.get('expected', 0):>11,} "
                f"expected  {p.get('lost', 0):>11,} lost  {causes}".rstrip()
            )
    for m in METRICS:
        unit = f" ({m.unit})" if m.unit else ""
        lines += [
            "",
            f"{m.title}{unit}",
            f"  {'group':<{width}}  {'n':>6}  {'mean':>9}  {'p5–p95':>19}  difference",
        ]
        for g in groups:
            r = g.metrics[m.column]
            spread = f"{_fmt(r.stats.p5, m)}–{_fmt(r.stats.p95, m)}" if r.stats.n else "–"
            diff = " ".join(x for x in (_fmt_diff(r.comparison, m), r.comparison.note) if x)
            lines.append(
                f"  {_label(g):<{width}}  {r.stats.n:>6}  {_fmt(r.stats.mean, m):>9}  "
                f"{spread:>19}  {diff}".rstrip()
            )
    return "\n".join(lines)


def to_json(groups: Sequence[GroupReport], meta: dict[str, Any]) -> str:
    """Raw SI units (seconds, tokens/s): machines convert, people read the text form."""
    return json.dumps({**meta, "groups": [asdict(g) for g in groups]}, indent=2)


def plot(rows: Sequence[Row], out: Path) -> None:
    """ITL p50 and tokens per step by variant, boxes at p25–p75, whiskers at p5–p95."""
    import matplotlib  # type: ignore[import-not-found]  # lazy: optional, and slow to import

    matplotlib.use("Agg")  # no display on a server
    import matplotlib.pyplot as plt  # type: ignore[import-not-found]

    ok = [r for r in rows if r["outcome"] == "ok"]
    grouped = group_rows(ok, ["variant"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (
        ("itl_p50_s", "ITL p50 per request (ms)", 1000.0),
        ("tokens_per_step", "tokens per target step", 1.0),
    )
    for ax, (col, title, scale) in zip(axes, panels, strict=True):
        data = [[r[col] * scale for r in g if r[col] is not None] for _, g in grouped]
        labels = [f"{key[0]}\nn={len(d)}" for (key, _), d in zip(grouped, data, strict=True)]
        ax.boxplot(
            [d or [float("nan")] for d in data], whis=(5, 95), showmeans=True, showfliers=False
        )
        ax.set_xticks(range(1, len(labels) + 1), labels)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("by variant: box p25–p75, whiskers p5–p95, triangle = mean")
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# --- command line -------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specrouter report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument("--db", type=Path, help=f"the request log (default: STATE_DIR/{DB_NAME})")
    where.add_argument(
        "--state-dir",
        type=Path,
        help="the gateway's state directory (default: $SPECROUTER_STATE_DIR, else .state when "
        "it holds a request log, else the demo's)",
    )
    p.add_argument("--since", default="24h", help="window: 30m, 22h, 7d, or 'all' (default 24h)")
    p.add_argument(
        "--by",
        default="variant",
        help=f"comma-separated group keys: {', '.join(GROUP_KEYS)} (default variant)",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw ITL and tokens per step by variant (needs matplotlib)",
    )
    return p


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    keys = [k.strip() for k in args.by.split(",") if k.strip()]
    unknown = [k for k in keys if k not in GROUP_KEYS]
    if unknown or not keys:
        parser.error(f"--by: unknown key(s) {unknown}; choose from {', '.join(GROUP_KEYS)}")
    try:
        since = None if args.since == "all" else parse_since(args.since)
    except ValueError as exc:
        parser.error(f"--since: {exc}")
    db: Path = args.db if args.db is not None else _state_dir(args.state_dir) / DB_NAME
    if not db.is_file():
        print(f"specrouter report: no request log at {db}", file=sys.stderr)
        return 1
    try:
        rows = load_rows(db, since)
    except sqlite3.Error as exc:
        print(f"specrouter report: cannot read {db}: {exc}", file=sys.stderr)
        return 1
    groups = build_report(rows, keys)
    window = "all time" if since is None else f"last {args.since}"
    if args.json:
        print(
            to_json(
                groups,
                {
                    "db": str(db),
                    "since_s": since,
                    "by": keys,
                    "requests": len(rows),
                    "min_runs": MIN_RUNS,
                },
            )
        )
    else:
        ok = sum(1 for r in rows if r["outcome"] == "ok")
        print(
            format_text(
                groups,
                header=[
                    f"request log {db}, {window}: {len(rows)} requests, {ok} ok{_continued(rows)}",
                    "figures from ok requests: n, mean and p5–p95 of per-request values; difference from "
                    f"the reference; 'too few' under {MIN_RUNS} requests, 'not separable' when the "
                    "p5–p95 ranges overlap",
                ],
            )
        )
    return _plot(rows, args.plot) if args.plot is not None else 0


def _state_dir(given: Path | None) -> Path:
    """The flag's, the variable's, the gateway's default (`.state`) when it has a log, else the
    demo's (`specrouter demo` keeps its own in .state/demo)."""
    if given is not None:
        return given
    if os.environ.get("SPECROUTER_STATE_DIR"):
        return Path(os.environ["SPECROUTER_STATE_DIR"])
    served = Path(".state")
    return served if (served / DB_NAME).is_file() else demo_state()


def _continued(rows: Sequence[Row]) -> str:
    """', N continued (a->b x2, ...)': streams finished by another engine, both named."""
    pairs = Counter(
        f"{r['continued_from']}->{r['variant']}" for r in rows if r.get("continued_from")
    )
    if not pairs:
        return ""
    detail = ", ".join(f"{p} x{n}" for p, n in pairs.most_common())
    return f", {sum(pairs.values())} continued ({detail})"


def _plot(rows: Sequence[Row], out: Path) -> int:
    try:
        plot(rows, out)
    except ImportError:
        print(
            "specrouter report: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr
        )
        return 2
    print(f"plot written to {out}", file=sys.stderr)
    return 0
