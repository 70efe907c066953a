"""The soak's table: outcomes per scenario, time to detect and to recover, what failed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from loadtests.bench.soak.base import LEAN_MALLOC, SoakBase


@dataclass(slots=True)
class Row:
    scenario: str
    runs: int = 0
    sent: int = 0
    ok: int = 0
    lost: int = 0
    errored: int = 0
    stray: int = 0
    continued: int = 0
    detect_s: list[float] = field(default_factory=list)
    recover_s: list[float] = field(default_factory=list)
    lost_examples: list[str] = field(default_factory=list)


class Accounting(SoakBase):
    def rows(self) -> list[Row]:
        by_name: dict[str, Row] = {}
        order: list[str] = []

        def row(name: str) -> Row:
            if name not in by_name:
                by_name[name] = Row(name)
                order.append(name)
            return by_name[name]

        steady = Row("steady load (no fault)")
        for run in self.runs:
            r = row(run.name)
            r.runs += 1
            r.continued += int(round(run.continued))
            if run.detect_s is not None:
                r.detect_s.append(run.detect_s)
            if run.recover_s is not None:
                r.recover_s.append(run.recover_s)
        runs = sorted(self.runs, key=lambda r: r.start)
        for o in self.outcomes:
            if o.t0 < self.t_start:
                continue
            owner = next((r for r in runs if o.t0 <= r.settle_end and o.t1 >= r.start), None)
            r = steady if owner is None else by_name[owner.name]
            failing = None if owner is None else owner.failing
            r.sent += 1
            if o.lost:
                r.lost += 1
                if len(r.lost_examples) < 5:
                    r.lost_examples.append(f"{o.kind} {o.backend or '-'} {o.detail}")
            elif o.errored:
                if failing is not None and o.backend in (failing, ""):
                    r.errored += 1
                else:
                    r.stray += 1
                    if len(r.lost_examples) < 5:
                        r.lost_examples.append(f"stray {o.kind} {o.backend or '-'} {o.detail}")
            else:
                r.ok += 1
        steady.runs = len(self.passes)
        return [by_name[n] for n in order] + [steady]

    def report(self) -> dict[str, Any]:
        return {
            "minutes": round((self.t_end - self.t_start) / 60, 2),
            "quick": self.quick,
            "passes": [asdict(p) for p in self.passes],
            "rows": [asdict(r) for r in self.rows()],
            "runs": [asdict(r) for r in self.runs],
            "bad_inputs": [asdict(b) for b in self.bad],
            "rss_kb": {"start": self.rss_start, "max": self.rss_max, "end": self.rss_end},
            "gateway_cpu_s": round(self.cpu_s, 1),
            "gateway_cpu_pct": round(self.gateway_cpu_pct, 1),
            "allocator": (
                " ".join(f"{k}={v}" for k, v in LEAN_MALLOC.items())
                if self.lean_malloc
                else "glibc defaults"
            ),
            "requests": len([o for o in self.outcomes if o.t0 >= self.t_start]),
        }

    def failed(self) -> list[str]:
        out = []
        for r in self.rows():
            if r.lost or r.stray:
                out.append(f"{r.scenario}: {r.lost} lost, {r.stray} stray: {r.lost_examples}")
        for p in self.passes:
            if p.in_flight or p.gauge or p.queued or p.close_wait:
                out.append(f"pass {p.n} did not settle: {p}")
        for run in self.runs:
            if "MISMATCH" in run.note:
                out.append(f"{run.name}: {run.note}")
        out += [
            f"bad input {b.what}: expected {b.expected}, got {b.got}" for b in self.bad if not b.ok
        ]
        return out


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    med = values[len(values) // 2]
    if len(values) == 1:
        return f"{med:.2f}"
    return f"{med:.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Fault soak: {report['minutes']} min, {len(report['passes'])} pass(es), "
        f"{report['requests']} requests from 16 workers (+ probes and disconnects).",
        "",
        "| scenario | runs | requests | ok | lost | errored | stray errors | continued | "
        "detect s | recover s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["rows"]:
        lines.append(
            f"| {r['scenario']} | {r['runs']} | {r['sent']} | {r['ok']} | {r['lost']} | "
            f"{r['errored']} | {r['stray']} | {r['continued']} | {_span(r['detect_s'])} | "
            f"{_span(r['recover_s'])} |"
        )
    rss = report["rss_kb"]
    lines += [
        "",
        "detect/recover: median (min-max) over the runs. errored: clear errors on the failing "
        "backend (an error event then [DONE], or an OpenAI error with Retry-After); stray: "
        "errors anywhere else; lost: cut, hung or malformed.",
        "",
        f"Gateway RSS: {rss['start'] / 1024:.1f} MiB at start (after warm-up), "
        f"{rss['max'] / 1024:.1f} MiB max, {rss['end'] / 1024:.1f} MiB at the end. "
        f"Gateway CPU: {report['gateway_cpu_s']} s, {report['gateway_cpu_pct']}% of one core "
        f"over the soak. Allocator: {report.get('allocator', '?')}.",
        "",
        "After each pass (load paused): "
        + "; ".join(
            f"#{p['n']} in-flight {p['in_flight']}, gauge {p['gauge']:g}, "
            f"upstream conns {p['upstream_established']} (CLOSE_WAIT {p['close_wait']}),"
            f" RSS {p['rss_kb'] / 1024:.1f} MiB, fds {p['fds']}"
            for p in report["passes"]
        ),
    ]
    uniq = list(dict.fromkeys(f"- {r['name']}: {r['note']}" for r in report["runs"] if r["note"]))
    if uniq:
        lines += ["", "Notes:", *uniq[:20]]
    if report["bad_inputs"]:
        lines += ["", "| bad input | expected | got | ms |", "|---|---|---|---:|"]
        for b in report["bad_inputs"]:
            mark = "" if b["ok"] else " **UNEXPECTED**"
            lines.append(f"| {b['what']} | {b['expected']} | {b['got']}{mark} | {b['ms']:.0f} |")
    return "\n".join(lines)
