"""`specrouter probe`: the GB10 facts' measurement method as a command.

    specrouter probe [run] --url https://gw:8443 --key KEY --model coder \\
        [--admin-url https://127.0.0.1:9443 --admin-token TOKEN] [--backend NAME ...] \\
        [--metrics-url URL ...] [--concurrency 1,2,4,8,16] [--temperatures 0.7,unset] \\
        [--repeats 3,3,2,2,2] [--window 40] [--out results.json]
    specrouter probe compare A.json B.json [...] [--metric tok_s] [--plot both.png]
    specrouter probe facts RESULTS.json [--profile mtp3]
    specrouter probe pair --a ENGINE_URL --b ENGINE_URL [--concurrency 4]   (two engines, one GPU)

N concurrent code-generation streams against a base URL (the gateway, or an engine directly);
decode throughput from the engine's own counters over a window (`/metrics` of the engine, or
the gateway's admin `/metrics`, which re-exports them per backend); then one fresh ~12K-token
prefill timed for prompt tokens/s. Every cell is repeated (3 runs at 1 and 2 streams, 2 above by
default) and reported as mean, min-max and run count.

Against the simulated backend (`specrouter sim --time-scale F`) the probe reads F from the
engine's `/version` (directly, or through the gateway's admin API for the backends behind it) and
waits F times shorter; every figure is unscaled. `--time-scale` overrides.

Writes a JSON results file (the full configuration, every run) and a PNG of tokens/s against
concurrency. Ctrl-C stops cleanly and writes what was measured (exit 130).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import sys
from pathlib import Path
from typing import Any

import httpx

from loadtests.probe.args import run_parser
from loadtests.probe.compare import cmd_compare, cmd_facts
from loadtests.probe.discover import _base, _slug, _verify, default_label, discover
from loadtests.probe.report import Results, format_prefill, format_table, plot
from loadtests.probe.run import Probe, ProbeConfig, Progress, fmt_duration
from loadtests.probe.stats import temp_label

_SECRET_FLAGS = ("--key", "--admin-token", "--metrics-key")


def redact(argv: list[str]) -> list[str]:
    """The command line without the client key and admin token."""
    out: list[str] = []
    hide = False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
        elif a in _SECRET_FLAGS:
            out.append(a)
            hide = True
        elif a.startswith(tuple(f + "=" for f in _SECRET_FLAGS)):
            out.append(a.split("=", 1)[0] + "=***")
        else:
            out.append(a)
    return out


def config_json(cfg: ProbeConfig, args_argv: list[str]) -> dict[str, Any]:
    return {
        "concurrency": cfg.concurrency,
        "temperatures": [temp_label(t) for t in cfg.temperatures],
        "repeats": {str(n): cfg.runs_for(n) for n in cfg.concurrency},
        "window_s": cfg.window_s,
        "warmup_s": cfg.warmup_s,
        "warmup_requests": cfg.warmup_requests,
        "warmup_max_tokens": cfg.warmup_max_tokens,
        "max_tokens": cfg.max_tokens,
        "ignore_eos": cfg.ignore_eos,
        "prefill_tokens": cfg.prefill_tokens,
        "time_scale": cfg.time_scale,
        "seed": cfg.seed,
        "max_seconds": cfg.max_seconds,
        "max_requests": cfg.max_requests,
        "metrics": [s.describe() for s in cfg.sources],
        "argv": redact(args_argv),
    }


async def run_probe(
    cfg: ProbeConfig,
    *,
    label: str,
    target: dict[str, Any],
    out: Path,
    plot_path: Path | None,
    progress: Progress,
    argv: list[str],
    handle_sigint: bool = True,
) -> tuple[Results, int]:
    """Measure, then write the JSON (and PNG). Returns the results and an exit status."""
    probe = Probe(cfg, progress)
    loop = asyncio.get_running_loop()
    if handle_sigint:

        def on_sigint() -> None:
            if probe.stop.is_set():
                loop.remove_signal_handler(signal.SIGINT)  # a second Ctrl-C: no more grace
            probe.request_stop("interrupted (Ctrl-C)")

        loop.add_signal_handler(signal.SIGINT, on_sigint)
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    status = 0
    error = ""
    try:
        await probe.run()
    except (RuntimeError, httpx.HTTPError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        progress.line(f"probe failed: {error}")
        status = 1
    finally:
        if handle_sigint:
            loop.remove_signal_handler(signal.SIGINT)
    if probe.stop.is_set():
        status = 130 if probe.stop_reason.startswith("interrupted") else 3
    results = Results(
        label=label,
        config=config_json(cfg, argv),
        target=target,
        runs=probe.results,
        prefill=probe.prefill,
        started_at=started,
        finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        interrupted=probe.stop.is_set() or bool(error),
        stop_reason=probe.stop_reason or error,
    )
    results.write(out)
    if plot_path is not None and results.runs:
        title = f"{label}: aggregate decode tokens/s (unscaled), mean and min-max of runs"
        if not plot([(label, results.runs)], plot_path, title):
            progress.line("no PNG: matplotlib is not installed (pip install 'specrouter[plot]')")
            plot_path = None
    print(
        format_table(
            results.runs,
            f"\n{label}: aggregate decode tokens/s over a "
            f"{cfg.window_s:g} s window (unscaled; time scale "
            f"{cfg.time_scale:g})",
        )
    )
    print(format_prefill(results.prefill))
    print(f"results: {out}" + (f", plot: {plot_path}" if plot_path else ""))
    return results, status


def cmd_run(argv: list[str]) -> int:
    import os

    args = run_parser().parse_args(argv)
    key = args.key or os.environ.get("SPECROUTER_PROBE_KEY")
    admin_token = args.admin_token or os.environ.get("SPECROUTER_ADMIN_TOKEN")
    if args.repeats is not None and len(args.repeats) not in (1, len(args.concurrency)):
        print(
            "specrouter probe: --repeats takes one number or one per concurrency", file=sys.stderr
        )
        return 2

    async def main() -> int:
        target, sources, scale = await discover(args, key, admin_token)
        repeats: dict[int, int] = {}
        if args.repeats is not None:
            reps = args.repeats * len(args.concurrency) if len(args.repeats) == 1 else args.repeats
            repeats = dict(zip(args.concurrency, reps, strict=True))
        cfg = ProbeConfig(
            url=_base(args.url),
            model=str(target["model"]),
            key=key,
            sources=sources,
            concurrency=args.concurrency,
            temperatures=args.temperatures,
            repeats=repeats,
            window_s=args.window,
            warmup_s=args.warmup,
            warmup_requests=args.warmup_requests,
            warmup_max_tokens=args.warmup_max_tokens,
            max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
            prefill_tokens=args.prefill_tokens,
            time_scale=scale,
            seed=args.seed,
            verify=_verify(args),
            admin_url=target.get("admin_url"),
            admin_token=admin_token,
            max_seconds=args.max_minutes * 60.0 if args.max_minutes else None,
        )
        planned = sum(n for n, _, _ in cfg.plan())
        cfg.max_requests = args.max_requests or 4 * planned * (1 + cfg.warmup_requests) + 10
        label = args.label or default_label(target)
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        out: Path = args.out or Path(f"probe-{_slug(label)}-{stamp}.json")
        plot_path = None if args.no_plot else (args.plot or out.with_suffix(".png"))
        progress = Progress(quiet=args.quiet)
        probe = Probe(cfg)
        progress.line(
            f"probe {label}: {target['via']} {cfg.url}, model {cfg.model}, "
            f"policy {target.get('policy_version', '-')}; counters from "
            f"{', '.join(s.url + (' ' + ','.join(s.backends) if s.backends else '') for s in sources)}; "
            f"time scale {scale:g} ({target['time_scale']['source']}); "
            f"{len(cfg.plan())} runs, about {fmt_duration(probe.remaining_estimate())}"
        )
        _, status = await run_probe(
            cfg,
            label=label,
            target=target,
            out=out,
            plot_path=plot_path,
            progress=progress,
            argv=argv,
        )
        return status

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print("specrouter probe: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return cmd_compare(argv[1:])
    if argv and argv[0] == "facts":
        return cmd_facts(argv[1:])
    if argv and argv[0] == "pair":
        from loadtests.probe.pair import cmd_pair

        return cmd_pair(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
