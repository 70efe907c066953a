"""`specrouter probe compare` and `specrouter probe facts`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from loadtests.probe.report import METRICS, Results, compare_results, format_compare, group, plot
from loadtests.probe.stats import summarize, temp_label
from proxy.helptext import DefaultsHelp


def cmd_compare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="specrouter probe compare",
        description="Side by side: % change per cell against the first "
        "file, with separability and re-measure flags.",
        formatter_class=DefaultsHelp,
    )
    p.add_argument("files", nargs="+", type=Path, help="results files; the first is the reference")
    p.add_argument("--metric", choices=sorted(METRICS), default="tok_s", help="the figure compared")
    p.add_argument("--plot", type=Path, default=None, help="PNG with every configuration")
    args = p.parse_args(argv)
    if len(args.files) < 2:
        p.error("give at least two results files")
    try:
        results = [Results.load(f) for f in args.files]
    except (OSError, ValueError, KeyError) as exc:
        print(f"specrouter probe compare: {exc}", file=sys.stderr)
        return 2
    labels, rows = compare_results(results, args.metric)
    for label, r, f in zip(labels, results, args.files, strict=True):
        scale = (r.config or {}).get("time_scale")
        extra = " (interrupted)" if r.interrupted else ""
        print(
            f"{label}: {f} ({r.target.get('via', '?')}, policy "
            f"{r.target.get('policy_version', '-')}, time scale {scale}, "
            f"{len(r.runs)} runs, {r.started_at}){extra}"
        )
    print()
    print(format_compare(labels, rows, args.metric))
    if args.plot is not None:
        if plot(
            [(lbl, r.runs) for lbl, r in zip(labels, results, strict=True)],
            args.plot,
            "aggregate decode tokens/s (unscaled), mean and min-max of runs",
        ):
            print(f"plot: {args.plot}")
        else:
            print("no PNG: matplotlib is not installed")
    return 0


# GB10 facts at temperature 1.0 (shared/GB10-facts.md): one-stream cells only.
FACTS_TEMP1 = {"mtp3": {1: 18.5}, "dflash7-prob-block": {1: 28.6}}


def effective_temperature(r: Results, temperature: float | None) -> float | None:
    """The temperature the engine used: the client's, the gateway's injected default, or the
    engine's default (1.0 for the GB10 checkpoint)."""
    if temperature is not None:
        return temperature
    for run in r.runs:
        if run.temperature is None:
            for applied in run.defaults:
                for part in applied.split(","):
                    k, _, v = part.partition("=")
                    if k == "temperature":
                        return float(v)
    return 1.0


def cmd_facts(argv: list[str]) -> int:
    from loadtests.probe.calibrate import FACTS

    p = argparse.ArgumentParser(
        prog="specrouter probe facts",
        description="A results file against shared/GB10-facts.md "
        "(the simulated profiles' source), per cell.",
        formatter_class=DefaultsHelp,
    )
    p.add_argument("file", type=Path, help="a results file (`specrouter probe --out`)")
    p.add_argument("--profile", default=None, help="default: the simulated engine's profile")
    p.add_argument("--tolerance", type=float, default=0.10, help="relative difference allowed")
    args = p.parse_args(argv)
    r = Results.load(args.file)
    profile = args.profile
    if profile is None:
        names = {
            e["sim"]["profile"]
            for e in (r.target.get("engines") or {}).values()
            if e and "sim" in e
        }
        if len(names) != 1:
            print("specrouter probe facts: give --profile", file=sys.stderr)
            return 2
        profile = names.pop()
    facts = FACTS.get(profile)
    if facts is None:
        print(f"specrouter probe facts: no facts for {profile!r}", file=sys.stderr)
        return 2
    print(
        f"{r.label} vs GB10 facts for {profile} (aggregate decode tokens/s, tolerance "
        f"+-{100 * args.tolerance:.0f} %)"
    )
    print(f"{'temp':>5} {'eff':>4} {'N':>3}  {'measured':>22}  {'facts':>6}  {'diff':>8}")
    bad = 0
    for (n, t), runs in group(r.runs).items():
        s = summarize(x.tok_s for x in runs)
        if s is None:
            continue
        eff = effective_temperature(r, t)
        target = (
            facts.tok_s.get(n)
            if eff == 0.7
            else FACTS_TEMP1.get(profile, {}).get(n)
            if eff == 1.0
            else None
        )
        if target is None:
            print(f"{temp_label(t):>5} {temp_label(eff):>4} {n:>3}  {s.fmt():>22}  {'-':>6}")
            continue
        diff = (s.mean - target) / target
        ok = abs(diff) <= args.tolerance
        bad += not ok
        derived = " (derived)" if eff == 0.7 and n in facts.derived else ""
        print(
            f"{temp_label(t):>5} {temp_label(eff):>4} {n:>3}  {s.fmt():>22}  {target:>6.1f}  "
            f"{100 * diff:+7.1f}%{derived}{'' if ok else '  OUT OF TOLERANCE'}"
        )
    one = [
        x.tokens_per_step
        for x in r.runs
        if x.concurrency == 1
        and effective_temperature(r, x.temperature) == 0.7
        and x.tokens_per_step is not None
    ]
    ts = summarize(one)
    if ts is not None:
        print(f"accepted tokens/step at 1 stream, 0.7: {ts.fmt(2)} (facts {facts.accept:.2f})")
    print("OK" if not bad else f"{bad} cell(s) out of tolerance")
    return 1 if bad else 0
