"""Does the policy earn its keep? Its simulated variants behind the gateway, swept with the probe.

Run: `python -m loadtests.bench.sweep policy [--quick] [--policy FILE]` (by default the former
GB10 default, loadtests/bench/sweep/gb10-three.yaml: DFlash block 7 and block 5, both
probabilistic + block, and the MTP fallback).

For every cell (1, 2, 4, 8, 16 streams at temperature 0.7 and unset), aggregate decode tokens/s
measured by the probe through the real gateway (TLS) in three configurations, each a gateway
started on the same two simulated engines:

* only variant A (the route's variants cut to A, rules naming the other variant removed);
* only variant B;
* the policy: the route as written (a route-scoped load rule: the deep block while at most two
  sequences are in flight, the other variant above).

Two engines are not twice the hardware: a route-scoped load rule at a steady concurrency sends
*every* new request to one variant, but the streams opened together split (the first two on A).
So each stream first sends short warm-up requests, the last held open and handed over to
the measured (long) request one stream at a time (loadtests/probe/run.py); the measured
requests are routed at the steady concurrency, and every run is checked to have produced >= 99 % of its window's
tokens on one engine (else it is measured again). The counters are each engine's own.

The prompts are the probe's, the same in every configuration (same seed), so the three are
measured on the same content. Exit status 0 when the policy reaches >= 97 % of the best single
variant in every cell while each single variant falls below that in some cell; 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from loadtests.harness.procs import ADMIN_TOKEN, GatewayProc, SimProc
from loadtests.probe.args import _ints, _temps
from loadtests.probe.command import config_json
from loadtests.probe.report import Results, cell_summaries, format_table, group, plot
from loadtests.probe.run import MetricsSource, Probe, ProbeConfig, Progress, RunResult
from loadtests.probe.stats import CellKey, Summary, Verdict, policy_verdict, temp_label
from loadtests.sim.profiles import BUILTIN_PROFILES
from proxy.auth import hash_key

DEFAULT_POLICY = Path(__file__).resolve().parent / "gb10-three.yaml"
CLIENT_KEY = "sk-policy-sweep"
ONE_ENGINE_SHARE = 0.99
# The measured requests' length: the route's clamp, so that none ends inside a run even when a
# loaded machine stretches the run ten-fold. One that ended would be sent again, together with
# the others that ended with it, and routed at the in-flight count of that moment (the first two
# to block 7 at four streams): a split run, measured again, and split again.
LONG_TOKENS = 32768


def profile_for(spec: Mapping[str, Any] | None) -> str:
    """The built-in simulated profile whose speculative configuration matches a backend's."""

    def norm(s: Mapping[str, Any] | None) -> tuple[Any, ...] | None:
        if not s:
            return None
        return (
            s.get("method"),
            s.get("num_speculative_tokens"),
            s.get("draft_sample_method") or "greedy",
            s.get("rejection_sample_method") or "standard",
        )

    want = norm(spec)
    for name, prof in BUILTIN_PROFILES.items():
        if prof.kind == "generate" and norm(prof.speculative_config) == want:
            return name
    raise ValueError(
        f"no simulated profile matches speculative {dict(spec or {})}; give --sim BACKEND=PROFILE"
    )


def restrict(
    doc: dict[str, Any], route: str, variants: list[str], urls: Mapping[str, str], key_sha: str
) -> dict[str, Any]:
    """The policy document cut to `route` over `variants`, on the simulated engines' URLs."""
    out = copy.deepcopy(doc)
    r = out["routes"][route]
    out["routes"] = {route: r}
    keep = set(variants)
    out["backends"] = {
        name: {
            **{k: v for k, v in spec.items() if k not in ("url", "urls", "api_key")},
            "url": urls[name],
        }
        for name, spec in out["backends"].items()
        if name in keep
    }
    r["variants"] = [v for v in r["variants"] if v in keep]
    if r.get("fallback") not in keep:
        r["fallback"] = r["variants"][-1] if len(r["variants"]) > 1 else None
        if r["fallback"] is None:
            r.pop("fallback")
    rules = []
    for rule in r.get("rules") or []:
        named = {rule.get(k) for k in ("use", "otherwise", "variant", "fallback")} - {None}
        if not named <= keep:
            continue  # it names a variant this configuration does not have
        if rule.get("kind") == "acceptance_guard" and not (
            rule.get("fallback") or r.get("fallback")
        ):
            continue  # a single variant has nowhere to fall back to
        rules.append(rule)
    r["rules"] = rules
    out["clients"] = [{"name": "bench", "key_sha256": key_sha}]
    return out


def _one_engine(result: RunResult) -> str | None:
    """A reason to measure again when the window's tokens came from more than one engine."""
    tokens = sum(result.sources.values())
    if tokens <= 0:
        return "no tokens in the window"
    top = max(result.sources.values()) / tokens
    if top < ONE_ENGINE_SHARE:
        return f"streams split over engines: {100 * top:.1f} % of the tokens on one"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.bench.sweep policy",
        description=__doc__.split("\n")[0] if __doc__ else None,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: one run per cell, 8 s windows, 0.05 time scale",
    )
    p.add_argument("--policy", type=Path, default=DEFAULT_POLICY)
    p.add_argument("--route", default=None, help="default: the policy's first generate route")
    p.add_argument(
        "--sim",
        action="append",
        default=[],
        metavar="BACKEND=PROFILE",
        help="simulated profile per backend (default: matched on `speculative`)",
    )
    p.add_argument("--time-scale", type=float, default=None, help="0.05")
    p.add_argument("--window", type=float, default=None, help="unscaled seconds (40; quick 8)")
    p.add_argument("--warmup", type=float, default=None, help="unscaled seconds (5; quick 1)")
    p.add_argument(
        "--warmup-requests",
        type=int,
        default=None,
        help="short requests per stream before the measured one (2; quick 1)",
    )
    p.add_argument("--concurrency", type=_ints, default=_ints("1,2,4,8,16"))
    p.add_argument("--temperatures", type=_temps, default=_temps("0.7,unset"))
    p.add_argument(
        "--repeats",
        type=_ints,
        default=None,
        help="one number, or one per concurrency (3 at 1-2 streams, 2 above; quick 1)",
    )
    p.add_argument("--threshold", type=float, default=0.97)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="directory for the three results files (default: a temp directory)",
    )
    p.add_argument("--quiet", action="store_true")
    return p


def format_verdict(
    labels: Mapping[str, str],
    singles: Mapping[str, Mapping[CellKey, Summary]],
    policy: Mapping[CellKey, Summary],
    verdict: Verdict,
    threshold: float,
) -> str:
    names = list(singles)
    texts = [x.fmt() for m in (*singles.values(), policy) for x in m.values()]
    w = max(len(t) for t in [*labels.values(), *texts]) + 2
    head = (
        f"{'temp':>5} {'N':>3}  "
        + "".join(f"{labels[n]:<{w}}" for n in names)
        + f"{labels['policy']:<{w}}"
        + f"{'policy/best':>11}  best single"
    )
    lines = [head, "-" * len(head)]
    for row in verdict.rows:
        n, t = row.key
        cells = "".join(
            f"{(singles[x][row.key].fmt() if row.key in singles[x] else '-'):<{w}}" for x in names
        )
        pol = policy.get(row.key)
        ratio = row.ratios.get("policy")
        mark = "" if row.policy_ok else "  < threshold"
        lines.append(
            f"{temp_label(t):>5} {n:>3}  {cells}{(pol.fmt() if pol else '-'):<{w}}"
            f"{('-' if ratio is None else f'{100 * ratio:.1f} %'):>11}  "
            f"{labels.get(row.best_single, row.best_single)}{mark}"
        )
    lines.append("")
    pct = f"{100 * threshold:.0f} %"
    lines.append(
        f"policy >= {pct} of the best single variant in every cell: "
        f"{'yes' if verdict.policy_ok else 'NO'}"
    )
    for name in names:
        below = verdict.singles_fail[name]
        where = ", ".join(
            f"N={n} temp {temp_label(t)} ({100 * verdict_ratio(verdict, (n, t), name):.1f} %)"
            for n, t in below
        )
        lines.append(
            f"{labels[name]} alone falls below {pct} of the best in some cell: "
            f"{'yes: ' + where if below else 'NO'}"
        )
    return "\n".join(lines)


def verdict_ratio(verdict: Verdict, key: CellKey, name: str) -> float:
    for row in verdict.rows:
        if row.key == key:
            return row.ratios.get(name, 0.0)
    return 0.0


async def sweep(args: argparse.Namespace) -> int:
    quick = args.quick
    scale = args.time_scale or 0.05
    window = args.window or (8.0 if quick else 40.0)
    warmup = args.warmup if args.warmup is not None else (1.0 if quick else 5.0)
    warm_req = args.warmup_requests if args.warmup_requests is not None else (1 if quick else 2)
    reps = args.repeats or ([1] if quick else None)
    repeats: dict[int, int] = {}
    if reps is not None:
        reps = reps * len(args.concurrency) if len(reps) == 1 else reps
        repeats = dict(zip(args.concurrency, reps, strict=True))

    doc = yaml.safe_load(args.policy.read_text(encoding="utf-8"))
    route = args.route or next(
        name for name, r in doc["routes"].items() if r.get("task", "generate") == "generate"
    )
    variants: list[str] = list(doc["routes"][route]["variants"])
    chosen = dict(s.split("=", 1) for s in args.sim)
    profiles = {
        v: chosen.get(v) or profile_for(doc["backends"][v].get("speculative")) for v in variants
    }
    model = doc["routes"][route]["models"][0]
    labels = {v: f"only {v} ({profiles[v]})" for v in variants}
    labels["policy"] = f"policy ({args.policy.name})"
    out_dir = args.out or Path(tempfile.mkdtemp(prefix="policy-sweep-"))
    progress = Progress(quiet=args.quiet)
    progress.line(
        f"policy sweep: route {route!r} of {args.policy}, variants "
        + ", ".join(f"{v}={p}" for v, p in profiles.items())
        + f"; time scale {scale:g}, window {window:g} s, warm-up {warm_req} request(s)"
        f" + {warmup:g} s per stream; results in {out_dir}"
    )

    sims: dict[str, SimProc] = {}
    stop_all = False
    loop = asyncio.get_running_loop()
    current: list[Probe] = []

    def on_sigint() -> None:
        nonlocal stop_all
        stop_all = True
        for p in current:
            p.request_stop("interrupted (Ctrl-C)")

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    measured: dict[str, list[RunResult]] = {}
    try:
        for v in variants:
            sims[v] = SimProc(
                profiles[v],
                time_scale=scale,
                seed=args.seed,
                served_model_name=doc["backends"][v]["served_model_name"],
            )
        urls = {v: s.url for v, s in sims.items()}
        configs = [(v, [v]) for v in variants] + [("policy", variants)]
        for name, vs in configs:
            if stop_all:
                break
            policy_doc = restrict(doc, route, vs, urls, hash_key(CLIENT_KEY))
            with (
                tempfile.TemporaryDirectory(prefix="sweep-gw-") as tmp,
                GatewayProc(policy_doc, Path(tmp), scrape_interval_s=0.25) as gw,
            ):
                cfg = ProbeConfig(
                    url=gw.base,
                    model=model,
                    key=CLIENT_KEY,
                    sources=[MetricsSource(f"{u}/metrics", "engine") for u in urls.values()],
                    concurrency=args.concurrency,
                    temperatures=args.temperatures,
                    repeats=repeats,
                    window_s=window,
                    warmup_s=warmup,
                    warmup_requests=warm_req,
                    warmup_max_tokens=16,
                    max_tokens=LONG_TOKENS,
                    prefill_tokens=0,
                    time_scale=scale,
                    seed=args.seed,
                    verify=False,
                    admin_url=gw.admin,
                    admin_token=ADMIN_TOKEN,
                )
                cfg.max_requests = 4 * sum(n for n, _, _ in cfg.plan()) * (1 + warm_req) + 10
                progress.line(f"\n== {labels[name]}: gateway {gw.base} ({len(cfg.plan())} runs) ==")
                probe = Probe(cfg, progress)
                current[:] = [probe]
                try:
                    await probe.run(redo_if=_one_engine)
                except RuntimeError as exc:
                    progress.line(f"{labels[name]}: probe failed: {exc}")
                    stop_all = True
                measured[name] = probe.results
                target = {
                    "url": gw.base,
                    "via": "gateway",
                    "model": model,
                    "policy": str(args.policy),
                    "variants": vs,
                    "engines": {
                        urls[v]: {"sim": {"profile": profiles[v], "time_scale": scale}} for v in vs
                    },
                    "rejected_runs": [
                        {"run": r.to_json(), "reason": why} for r, why in probe.rejected
                    ],
                }
                Results(
                    label=labels[name],
                    config=config_json(cfg, []),
                    target=target,
                    runs=probe.results,
                    prefill=None,
                    started_at="",
                    finished_at="",
                    interrupted=probe.stop.is_set(),
                    stop_reason=probe.stop_reason,
                ).write(out_dir / f"{name}.json")
                if probe.stop.is_set():
                    stop_all = True
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        for s in sims.values():
            s.close()

    for name, runs in measured.items():
        print(format_table(runs, f"\n{labels[name]}"))
    singles = {v: cell_summaries(measured.get(v, [])) for v in variants}
    policy = cell_summaries(measured.get("policy", []))
    verdict = policy_verdict(singles, policy, args.threshold)
    print(
        f"\nAggregate decode tokens/s through the gateway (unscaled; mean [min-max] x runs; "
        f"window {window:g} s, time scale {scale:g})"
    )
    print(format_verdict(labels, singles, policy, verdict, args.threshold))
    split = [(name, r) for name, runs in measured.items() for r in runs if _one_engine(r)]
    all_runs = sum(len(r) for r in measured.values())
    print(
        f"\nOne engine per measured run: {all_runs - len(split)}/{all_runs} runs had >= "
        f"{100 * ONE_ENGINE_SHARE:.0f} % of their window's tokens on one engine (each "
        f"stream sent {warm_req} short warm-up request(s) first, so that the load rule "
        "routed the measured requests at the steady concurrency; two simulated engines "
        "never counted as double hardware)."
        if not split
        else f"\nWARNING: {len(split)} run(s) split over both engines (double hardware): "
        + ", ".join(f"{n} N={r.concurrency} temp {temp_label(r.temperature)}" for n, r in split)
    )
    for name, runs in measured.items():
        via = {k for r in runs for k in r.variants}
        if name == "policy":
            byn: dict[int, set[str]] = {}
            for (n, _), rs in group(runs).items():
                byn.setdefault(n, set()).update(k for r in rs for k in r.variants)
            print(
                "policy routed the measured requests to: "
                + ", ".join(f"N={n}: {'+'.join(sorted(v))}" for n, v in sorted(byn.items()))
            )
        elif via - {name}:
            print(f"WARNING: {name} alone answered from {sorted(via)}")
    png = out_dir / "sweep.png"
    if plot(
        [(labels[n], runs) for n, runs in measured.items()],
        png,
        "policy sweep: aggregate decode tokens/s (unscaled), mean and min-max of runs",
    ):
        print(f"plot: {png}")
    print(f"results: {out_dir}")
    if stop_all and any(p.stop_reason.startswith("interrupted") for p in current):
        return 130
    return 0 if verdict.ok and not split else 1


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(sweep(args))
