"""The table: medians over repeats of what the gateway (and nginx) add over direct access."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.bench.overhead.plan import Plan
from loadtests.bench.overhead.result import RoundResult
from loadtests.bench.overhead.rounds import pct

# The overhead targets (docs/overhead.md; 2-core machine): metric -> (comparison, bound).
GOALS: dict[str, tuple[str, float]] = {
    "ttft1_added_ms": ("<=", 1.5),
    "ttft16_added_ms": ("<=", 2.0),
    "gap99_added_ms": ("<=", 0.5),
    "cpu_paced_us": ("<=", 100.0),
    "cpu_sat_us": ("<=", 30.0),
    "rss256_mb": ("<", 200.0),
}


@dataclass
class Figure:
    values: list[float]
    runs: int  # rounds that produced a value

    def cell(self, fmt: str) -> str:
        if not self.values:
            return "n/a"
        med = pct(self.values, 50)
        assert med is not None
        lo, hi = min(self.values), max(self.values)
        return f"{med:{fmt}} ({lo:{fmt}}–{hi:{fmt}}, n={self.runs})"

    @property
    def median(self) -> float | None:
        return pct(self.values, 50)


def summarize(results: list[RoundResult], targets: Sequence[str]) -> dict[str, dict[str, Figure]]:
    """metric -> target -> Figure. Added figures pair each round with the same repeat's direct."""
    by: dict[tuple[str, str, int], RoundResult] = {}
    for r in results:
        if r.ok:
            by[(r.kind, r.target, r.repeat)] = r
    repeats = sorted({r.repeat for r in results})
    out: dict[str, dict[str, Figure]] = {}

    def added(metric: str, kind: str, attr: str) -> None:
        out[metric] = {}
        for t in targets:
            vals = []
            for rep in repeats:
                a, d = by.get((kind, t, rep)), by.get((kind, "direct", rep))
                if a is None or d is None:
                    continue
                av, dv = getattr(a, attr), getattr(d, attr)
                if av is not None and dv is not None:
                    vals.append(av - dv if t != "direct" else av)
            out[metric][t] = Figure(vals, len(vals))

    def plain(metric: str, kind: str, attr: str, scale: float = 1.0) -> None:
        out[metric] = {}
        for t in targets:
            vals = [
                getattr(r, attr) * scale
                for (k, tt, _), r in by.items()
                if k == kind and tt == t and getattr(r, attr) is not None
            ]
            out[metric][t] = Figure(vals, len(vals))

    added("ttft1_added_ms", "ttft1", "ttft_p50_ms")
    added("ttft16_added_ms", "paced16", "ttft_p50_ms")
    added("gap99_added_ms", "paced16", "gap_p99_ms")
    plain("cpu_paced_us", "paced16", "cpu_per_chunk_us")
    plain("cpu_sat_us", "sat", "cpu_per_chunk_us")
    plain("sat_rate", "sat", "rate")
    plain("rss256_mb", "rss256", "rss_mb")
    plain("rss_idle_mb", "rss_idle", "rss_mb")
    plain("rss_end_mb", "rss_end", "rss_mb")
    plain("cpu_pct_sat", "sat", "cpu_pct")
    return out


def paced_cpu_ratio(results: list[RoundResult]) -> Figure:
    """Gateway over nginx CPU per paced chunk, each repeat against its own nginx round."""
    cpu = {
        (r.target, r.repeat): r.cpu_per_chunk_us
        for r in results
        if r.ok and r.kind == "paced16" and r.cpu_per_chunk_us
    }
    vals = [
        g / n
        for (t, rep), g in cpu.items()
        if t == "gateway" and g is not None and (n := cpu.get(("nginx", rep)))
    ]
    return Figure(vals, len(vals))


ROWS: list[tuple[str, str, str]] = [
    ("ttft1_added_ms", "added TTFT p50, 1 stream (ms)", ".2f"),
    ("ttft16_added_ms", "added TTFT p50, 16 streams (ms)", ".2f"),
    ("gap99_added_ms", "added gap p99, 16 streams/30 ms (ms)", ".2f"),
    ("cpu_paced_us", "CPU per chunk, 16 paced streams (µs)", ".1f"),
    ("cpu_sat_us", "CPU per chunk, saturated (µs)", ".1f"),
    ("sat_rate", "saturation rate (chunks/s)", ",.0f"),
    ("cpu_pct_sat", "proxy CPU while saturated (% of a core)", ".0f"),
    ("rss256_mb", "RSS at 256 open streams (MB)", ".1f"),
    ("rss_idle_mb", "RSS idle, after warm-up (MB)", ".1f"),
    ("rss_end_mb", "RSS at the end of the run (MB)", ".1f"),
]


def render(
    summary: dict[str, dict[str, Figure]], targets: Sequence[str], results: list[RoundResult]
) -> str:
    cols = [t for t in ("gateway", "baseline", "relay", "nginx") if t in targets]
    header = ["metric", *cols, "target", "gateway meets"]
    lines: list[list[str]] = []
    for key, label, fmt in ROWS:
        row = [label]
        for t in cols:
            row.append(summary[key][t].cell(fmt))
        goal = GOALS.get(key)
        if goal is None:
            row += ["—", ""]
        else:
            op, bound = goal
            row.append(f"{op} {bound:g}")
            med = summary[key]["gateway"].median if "gateway" in summary[key] else None
            if med is None:
                row.append("n/a")
            else:
                row.append("yes" if (med <= bound if op == "<=" else med < bound) else "NO")
        lines.append(row)
    widths = [max(len(r[i]) for r in [header, *lines]) for i in range(len(header))]

    def fmt_row(r: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |"

    out = [fmt_row(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt_row(r) for r in lines]
    base: list[str] = []
    direct = {
        k: [r for r in results if r.target == "direct" and r.kind == k and r.ok]
        for k in ("ttft1", "paced16", "sat")
    }
    for label, kind, attr, unit in (
        ("TTFT p50 1 stream", "ttft1", "ttft_p50_ms", "ms"),
        ("TTFT p50 16 streams", "paced16", "ttft_p50_ms", "ms"),
        ("gap p99 16 streams", "paced16", "gap_p99_ms", "ms"),
        ("rate", "sat", "rate", "chunks/s"),
    ):
        vals = [getattr(r, attr) for r in direct[kind] if getattr(r, attr) is not None]
        med = pct(vals, 50)
        if med is not None:
            base.append(
                f"{label} {med:,.0f} {unit}" if unit == "chunks/s" else f"{label} {med:.2f} {unit}"
            )
    if base:
        out.append("direct (the pacer, no proxy), medians: " + "; ".join(base))
    ratio = paced_cpu_ratio(results)
    if ratio.values:
        # A shared machine's speed moves between runs, nginx's figure with it: the ratio of
        # the two within one repeat tells what the gateway adds on that machine, that moment.
        out.append(f"gateway / nginx CPU per paced chunk, per repeat: {ratio.cell('.2f')}")
    if "baseline" in targets:
        out += baseline_lines(summary, results)
    failed = [r for r in results if not r.ok]
    if failed:
        out.append(
            f"{len(failed)} round(s) failed and are left out: "
            + "; ".join(f"{r.kind}/{r.target}#{r.repeat}: {r.error}" for r in failed[:6])
        )
    return "\n".join(out)


def versus(gateway: Sequence[float], baseline: Sequence[float], paired: Sequence[float]) -> str:
    """The gateway against the baseline gateway (lower is better): a verdict from the ranges,
    then the medians, and the per-repeat differences (same repeat, interleaved rounds)."""
    if not gateway or not baseline:
        return "n/a"
    gm, bm = pct(gateway, 50) or 0.0, pct(baseline, 50) or 0.0
    if min(len(gateway), len(baseline)) < 2:  # one round says nothing of a range
        verdict = "no worse (one round)" if gm <= bm else "worse (one round)"
    elif max(gateway) < min(baseline):
        verdict = "better (ranges apart)"
    elif min(gateway) > max(baseline):
        verdict = "WORSE (ranges apart)"
    elif gm <= bm:
        verdict = "no worse (medians; ranges overlap)"
    else:
        verdict = "worse by the medians (ranges overlap)"
    diff = pct(paired, 50)
    said = (
        "" if diff is None else f"; per repeat {diff:+.2f} ({min(paired):+.2f}–{max(paired):+.2f})"
    )
    return f"{verdict}{said}"


def paired(results: Sequence[RoundResult], kind: str, attr: str) -> list[float]:
    """Gateway minus baseline, per repeat, for one round kind and attribute."""
    by = {(r.target, r.repeat): getattr(r, attr) for r in results if r.ok and r.kind == kind}
    out = []
    for (t, rep), g in by.items():
        b = by.get(("baseline", rep))
        if t == "gateway" and g is not None and b is not None:
            out.append(g - b)
    return out


def baseline_lines(
    summary: dict[str, dict[str, Figure]], results: Sequence[RoundResult]
) -> list[str]:
    """One-line prompts no worse than the baseline checkout's gateway, in this run."""
    out = ["gateway vs baseline (another checkout's gateway, same run):"]
    for key, kind, attr, label in (
        ("ttft1_added_ms", "ttft1", "ttft_p50_ms", "added TTFT p50, 1 stream (ms)"),
        ("ttft16_added_ms", "paced16", "ttft_p50_ms", "added TTFT p50, 16 streams (ms)"),
        ("gap99_added_ms", "paced16", "gap_p99_ms", "added gap p99, 16 streams (ms)"),
        ("cpu_paced_us", "paced16", "cpu_per_chunk_us", "CPU per chunk, 16 paced (µs)"),
        ("cpu_sat_us", "sat", "cpu_per_chunk_us", "CPU per chunk, saturated (µs)"),
    ):
        g, b = summary[key].get("gateway"), summary[key].get("baseline")
        if g is None or b is None or not g.values or not b.values:
            continue
        out.append(f"  {label}: {versus(g.values, b.values, paired(results, kind, attr))}")
    return out


def describe(plan: Plan, prompt_bytes: int) -> str:
    p, s, m = plan.paced16, plan.sat, plan.rss256
    return (
        f"rounds: ttft1 = 1 stream, {plan.ttft1.max_tokens}-token responses, "
        f"{plan.ttft1.duration_s:g} s; paced16 = 16 streams, {p.step_ms:g} ms step, "
        f"{p.max_tokens}-token responses, {p.duration_s:g} s of arrivals; sat = "
        f"{s.streams} streams unpaced, {s.duration_s:g} s window; rss256 = {m.streams} "
        f"streams at {m.step_ms:g} ms; {plan.repeats} repeats ({plan.rss_repeats} for "
        f"rss256); 1 token per chunk; request body ~{prompt_bytes} B; client on uvloop, "
        f"keep-alive, TLS 1.3 to the proxies"
    )
