"""`specrouter probe`: the GB10 facts' measurement method as a command.

    specrouter probe [run] --url https://gw:8443 --key KEY --model coder \\
        [--admin-url https://127.0.0.1:9443 --admin-token TOKEN] [--backend NAME ...] \\
        [--metrics-url URL ...] [--concurrency 1,2,4,8,16] [--temperatures 0.7,unset] \\
        [--repeats 3,3,2,2,2] [--window 40] [--out results.json]
    specrouter probe compare A.json B.json [...] [--metric tok_s] [--plot both.png]
    specrouter probe facts RESULTS.json [--profile mtp3]

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

import argparse
import asyncio
import datetime as dt
import signal
import ssl
import sys
from pathlib import Path
from typing import Any

import httpx

from loadtests.probe.report import (
    METRICS,
    Results,
    compare_results,
    format_compare,
    format_prefill,
    format_table,
    group,
    plot,
)
from loadtests.probe.run import MetricsSource, Probe, ProbeConfig, Progress, fmt_duration
from loadtests.probe.stats import summarize, temp_label
from proxy.vllm_wire import Family

DEFAULT_CONCURRENCY = "1,2,4,8,16"
DEFAULT_TEMPERATURES = "0.7,unset"


# -- argument parsing -----------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers: {text!r}") from exc
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1: {text!r}")
    return values


def _temps(text: str) -> list[float | None]:
    out: list[float | None] = []
    for x in text.split(","):
        x = x.strip().lower()
        if not x:
            continue
        if x in {"unset", "none", "default"}:
            out.append(None)
            continue
        try:
            out.append(float(x))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"temperature {x!r}: a number or 'unset'") from exc
    if not out:
        raise argparse.ArgumentTypeError("no temperature given")
    return out


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specrouter probe",
        description="Measure decode throughput and acceptance per concurrency and temperature "
                    "(subcommands: run (default), compare, facts).")
    t = p.add_argument_group("target")
    t.add_argument("--url", required=True,
                   help="base URL of the gateway or of an engine (with or without /v1)")
    t.add_argument("--key", default=None, help="client key (Bearer); env SPECROUTER_PROBE_KEY")
    t.add_argument("--model", default=None, help="model name to request (default: the first "
                   "of the target's /v1/models)")
    t.add_argument("--metrics-url", action="append", default=[],
                   help="an engine's /metrics, or the gateway's admin /metrics (repeatable; "
                        "counters are summed). Default: the engine's /metrics, or the gateway's "
                        "admin /metrics with --admin-url")
    t.add_argument("--backend", action="append", default=None,
                   help="with the gateway's re-exported metrics: the backend(s) to read "
                        "(default: every variant of the model's route)")
    t.add_argument("--admin-url", default=None, help="the gateway's admin listener: policy "
                   "version, backends and their speculative configuration")
    t.add_argument("--admin-token", default=None, help="env SPECROUTER_ADMIN_TOKEN")
    t.add_argument("--ca-cert", type=Path, default=None, help="CA bundle to verify TLS with")
    t.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    m = p.add_argument_group("measurement")
    m.add_argument("--concurrency", type=_ints, default=_ints(DEFAULT_CONCURRENCY))
    m.add_argument("--temperatures", type=_temps, default=_temps(DEFAULT_TEMPERATURES),
                   help="comma-separated; 'unset' sends no temperature (the server's default, "
                        "or the gateway's injected default)")
    m.add_argument("--repeats", type=_ints, default=None,
                   help="runs per cell: one number for all, or one per concurrency "
                        "(default 3 for 1 and 2 streams, 2 above)")
    m.add_argument("--window", type=float, default=40.0, help="seconds, unscaled (40)")
    m.add_argument("--warmup", type=float, default=5.0,
                   help="seconds (unscaled) after every stream decodes, before the window (5)")
    m.add_argument("--warmup-requests", type=int, default=0,
                   help="short requests per stream before the measured one, so a gateway's "
                        "load rule routes the measured requests at the steady concurrency (0)")
    m.add_argument("--warmup-max-tokens", type=int, default=16)
    m.add_argument("--max-tokens", type=int, default=8192,
                   help="per measured request; long enough to outlast the window (8192)")
    m.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                   help="do not send vLLM's ignore_eos (streams that end are re-opened)")
    m.add_argument("--prefill-tokens", type=int, default=12000,
                   help="size of the fresh prefill prompt; 0 skips it (12000)")
    m.add_argument("--time-scale", type=float, default=None,
                   help="the simulated backend's time scale (default: read from /version)")
    m.add_argument("--seed", type=int, default=0, help="selects the prompts (same seed: same "
                   "prompts, so two configurations are measured on the same content)")
    b = p.add_argument_group("bounds and output")
    b.add_argument("--max-minutes", type=float, default=None,
                   help="stop (and write what was measured) before this much wall time")
    b.add_argument("--max-requests", type=int, default=None,
                   help="stop after this many requests (default: 4x the planned streams)")
    b.add_argument("--label", default=None, help="name of the configuration in tables and plots")
    b.add_argument("--out", type=Path, default=None,
                   help="results JSON (default probe-LABEL-TIME.json)")
    b.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --out)")
    b.add_argument("--no-plot", action="store_true")
    b.add_argument("--quiet", action="store_true", help="no progress lines")
    return p


# -- discovery -----------------------------------------------------------------------------------


def _base(url: str) -> str:
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _verify(args: argparse.Namespace) -> ssl.SSLContext | bool:
    if args.insecure:
        return False
    if args.ca_cert is not None:
        return ssl.create_default_context(cafile=str(args.ca_cert))
    return True


async def _get_json(client: httpx.AsyncClient, url: str,
                    headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    try:
        resp = await client.get(url, headers=headers, timeout=5.0)
    except httpx.HTTPError:
        return None
    if resp.status_code != 200:
        return None
    try:
        data = resp.json()
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _engine_info(version: dict[str, Any] | None) -> dict[str, Any] | None:
    if version is None:
        return None
    sim = version.get("specrouter_sim")
    info: dict[str, Any] = {"vllm_version": version.get("version")}
    if isinstance(sim, dict):
        info["sim"] = sim
    return info


async def discover(args: argparse.Namespace, key: str | None,
                   admin_token: str | None) -> tuple[dict[str, Any], list[MetricsSource], float]:
    """What is being probed: (target description, counter sources, time scale)."""
    base = _base(args.url)
    verify = _verify(args)
    target: dict[str, Any] = {"url": base, "via": "gateway" if args.admin_url else "direct"}
    engines: dict[str, dict[str, Any] | None] = {}
    sources: list[MetricsSource] = []
    async with httpx.AsyncClient(verify=verify) as client:
        model = args.model
        if model is None:
            models = await _get_json(client, f"{base}/v1/models",
                                     {"authorization": f"Bearer {key}"} if key else None)
            data = (models or {}).get("data") or []
            if not data:
                raise SystemExit("specrouter probe: --model is required (no /v1/models answer)")
            model = str(data[0]["id"])
        target["model"] = model
        backends: list[str] | None = args.backend
        if args.admin_url:
            admin = _base(args.admin_url)
            hdr = {"authorization": f"Bearer {admin_token}"} if admin_token else None
            status = await _get_json(client, f"{admin}/admin/status", hdr)
            policy = await _get_json(client, f"{admin}/admin/policy", hdr)
            target["admin_url"] = admin
            target["policy_version"] = (status or policy or {}).get(
                "policy_version", (policy or {}).get("version"))
            doc = (policy or {}).get("document") or {}
            if backends is None:
                for route in (doc.get("routes") or {}).values():
                    if model in (route.get("models") or []):
                        backends = list(route.get("variants") or [])
                        target["route_rules"] = [r.get("name") for r in route.get("rules") or []]
                        target["route_defaults"] = route.get("defaults")
                        break
            described: dict[str, Any] = {}
            for name in backends or []:
                spec = (doc.get("backends") or {}).get(name) or {}
                urls = spec.get("urls") or ([spec["url"]] if spec.get("url") else [])
                described[name] = {"speculative": spec.get("speculative"), "urls": urls}
                for u in urls:
                    engines[u] = _engine_info(await _get_json(client, f"{_base(u)}/version"))
            target["backends"] = described
            if policy is None:
                target["note"] = "admin API not readable: no policy version or backend description"
        else:
            engines[base] = _engine_info(await _get_json(client, f"{base}/version"))
        target["engines"] = engines

        urls = args.metrics_url or ([f"{_base(args.admin_url)}/metrics"] if args.admin_url
                                    else [f"{base}/metrics"])
        for u in urls:
            hint = ("" if args.metrics_url or args.admin_url else
                    " (behind the gateway, give --admin-url, or the engine's --metrics-url)")
            try:
                resp = await client.get(u, timeout=5.0)
            except httpx.HTTPError as exc:
                raise SystemExit(f"specrouter probe: cannot read {u}: {exc}{hint}") from exc
            text = resp.text if resp.status_code == 200 else ""
            if "specrouter_backend_generation_tokens" in text:
                sources.append(MetricsSource(u, "gateway",
                                             tuple(backends) if backends is not None else None))
            elif Family.GENERATION_TOKENS in text:
                sources.append(MetricsSource(u, "engine"))
            else:
                raise SystemExit(f"specrouter probe: {u} (HTTP {resp.status_code}) has neither "
                                 f"vLLM's generation counter nor the gateway's re-exported "
                                 f"one{hint}")
    target["metrics"] = [s.describe() for s in sources]

    scales = {float(e["sim"]["time_scale"]) for e in engines.values() if e and "sim" in e}
    if args.time_scale is not None:
        scale, how = args.time_scale, "--time-scale"
    elif len(scales) > 1:
        raise SystemExit(f"specrouter probe: the backends run different time scales {scales}; "
                         "give --time-scale")
    elif scales:
        scale, how = scales.pop(), "read from the engine's /version"
    else:
        scale, how = 1.0, "real time (no simulated engine found)"
    target["time_scale"] = {"value": scale, "source": how}
    return target, sources, scale


def default_label(target: dict[str, Any]) -> str:
    profiles = sorted({e["sim"]["profile"] for e in target.get("engines", {}).values()
                       if e and "sim" in e})
    if profiles:
        name = "+".join(profiles)
    else:
        specs = [b.get("speculative") for b in (target.get("backends") or {}).values()]
        name = "+".join(_spec_name(s) for s in specs) if specs else str(target.get("model"))
    return name + ("@gateway" if target.get("via") == "gateway" else "")


def _spec_name(spec: dict[str, Any] | None) -> str:
    if not spec:
        return "nospec"
    name = f"{spec.get('method')}{spec.get('num_speculative_tokens')}"
    if spec.get("draft_sample_method") == "probabilistic":
        name += "-prob"
    if spec.get("rejection_sample_method") == "block":
        name += "-block"
    return name


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)


# -- run ------------------------------------------------------------------------------------------


_SECRET_FLAGS = ("--key", "--admin-token")


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
        "window_s": cfg.window_s, "warmup_s": cfg.warmup_s,
        "warmup_requests": cfg.warmup_requests, "warmup_max_tokens": cfg.warmup_max_tokens,
        "max_tokens": cfg.max_tokens, "ignore_eos": cfg.ignore_eos,
        "prefill_tokens": cfg.prefill_tokens, "time_scale": cfg.time_scale, "seed": cfg.seed,
        "max_seconds": cfg.max_seconds, "max_requests": cfg.max_requests,
        "metrics": [s.describe() for s in cfg.sources], "argv": redact(args_argv),
    }


async def run_probe(cfg: ProbeConfig, *, label: str, target: dict[str, Any], out: Path,
                    plot_path: Path | None, progress: Progress, argv: list[str],
                    handle_sigint: bool = True) -> tuple[Results, int]:
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
        label=label, config=config_json(cfg, argv), target=target, runs=probe.results,
        prefill=probe.prefill, started_at=started,
        finished_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        interrupted=probe.stop.is_set() or bool(error),
        stop_reason=probe.stop_reason or error)
    results.write(out)
    if plot_path is not None and results.runs:
        title = f"{label}: aggregate decode tokens/s (unscaled), mean and min-max of runs"
        if not plot([(label, results.runs)], plot_path, title):
            progress.line("no PNG: matplotlib is not installed (pip install 'specrouter[plot]')")
            plot_path = None
    print(format_table(results.runs, f"\n{label}: aggregate decode tokens/s over a "
                                     f"{cfg.window_s:g} s window (unscaled; time scale "
                                     f"{cfg.time_scale:g})"))
    print(format_prefill(results.prefill))
    print(f"results: {out}" + (f", plot: {plot_path}" if plot_path else ""))
    return results, status


def cmd_run(argv: list[str]) -> int:
    import os

    args = run_parser().parse_args(argv)
    key = args.key or os.environ.get("SPECROUTER_PROBE_KEY")
    admin_token = args.admin_token or os.environ.get("SPECROUTER_ADMIN_TOKEN")
    if args.repeats is not None and len(args.repeats) not in (1, len(args.concurrency)):
        print("specrouter probe: --repeats takes one number or one per concurrency",
              file=sys.stderr)
        return 2

    async def main() -> int:
        target, sources, scale = await discover(args, key, admin_token)
        repeats: dict[int, int] = {}
        if args.repeats is not None:
            reps = args.repeats * len(args.concurrency) if len(args.repeats) == 1 else args.repeats
            repeats = dict(zip(args.concurrency, reps, strict=True))
        cfg = ProbeConfig(
            url=_base(args.url), model=str(target["model"]), key=key, sources=sources,
            concurrency=args.concurrency, temperatures=args.temperatures, repeats=repeats,
            window_s=args.window, warmup_s=args.warmup, warmup_requests=args.warmup_requests,
            warmup_max_tokens=args.warmup_max_tokens, max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos, prefill_tokens=args.prefill_tokens, time_scale=scale,
            seed=args.seed, verify=_verify(args),
            admin_url=target.get("admin_url"), admin_token=admin_token,
            max_seconds=args.max_minutes * 60.0 if args.max_minutes else None)
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
            f"{len(cfg.plan())} runs, about {fmt_duration(probe.remaining_estimate())}")
        _, status = await run_probe(cfg, label=label, target=target, out=out,
                                    plot_path=plot_path, progress=progress, argv=argv)
        return status

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        print("specrouter probe: interrupted", file=sys.stderr)
        return 130


# -- compare and facts ------------------------------------------------------------------------------


def cmd_compare(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="specrouter probe compare",
                                description="Side by side: % change per cell against the first "
                                            "file, with separability and re-measure flags.")
    p.add_argument("files", nargs="+", type=Path)
    p.add_argument("--metric", choices=sorted(METRICS), default="tok_s")
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
        print(f"{label}: {f} ({r.target.get('via', '?')}, policy "
              f"{r.target.get('policy_version', '-')}, time scale {scale}, "
              f"{len(r.runs)} runs, {r.started_at}){extra}")
    print()
    print(format_compare(labels, rows, args.metric))
    if args.plot is not None:
        if plot([(lbl, r.runs) for lbl, r in zip(labels, results, strict=True)], args.plot,
                "aggregate decode tokens/s (unscaled), mean and min-max of runs"):
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

    p = argparse.ArgumentParser(prog="specrouter probe facts",
                                description="A results file against shared/GB10-facts.md "
                                            "(the simulated profiles' source), per cell.")
    p.add_argument("file", type=Path)
    p.add_argument("--profile", default=None, help="default: the simulated engine's profile")
    p.add_argument("--tolerance", type=float, default=0.10)
    args = p.parse_args(argv)
    r = Results.load(args.file)
    profile = args.profile
    if profile is None:
        names = {e["sim"]["profile"] for e in (r.target.get("engines") or {}).values()
                 if e and "sim" in e}
        if len(names) != 1:
            print("specrouter probe facts: give --profile", file=sys.stderr)
            return 2
        profile = names.pop()
    facts = FACTS.get(profile)
    if facts is None:
        print(f"specrouter probe facts: no facts for {profile!r}", file=sys.stderr)
        return 2
    print(f"{r.label} vs GB10 facts for {profile} (aggregate decode tokens/s, tolerance "
          f"+-{100 * args.tolerance:.0f} %)")
    print(f"{'temp':>5} {'eff':>4} {'N':>3}  {'measured':>22}  {'facts':>6}  {'diff':>8}")
    bad = 0
    for (n, t), runs in group(r.runs).items():
        s = summarize(x.tok_s for x in runs)
        if s is None:
            continue
        eff = effective_temperature(r, t)
        target = (facts.tok_s.get(n) if eff == 0.7 else
                  FACTS_TEMP1.get(profile, {}).get(n) if eff == 1.0 else None)
        if target is None:
            print(f"{temp_label(t):>5} {temp_label(eff):>4} {n:>3}  {s.fmt():>22}  {'-':>6}")
            continue
        diff = (s.mean - target) / target
        ok = abs(diff) <= args.tolerance
        bad += not ok
        derived = " (derived)" if eff == 0.7 and n in facts.derived else ""
        print(f"{temp_label(t):>5} {temp_label(eff):>4} {n:>3}  {s.fmt():>22}  {target:>6.1f}  "
              f"{100 * diff:+7.1f}%{derived}{'' if ok else '  OUT OF TOLERANCE'}")
    one = [x.tokens_per_step for x in r.runs
           if x.concurrency == 1 and effective_temperature(r, x.temperature) == 0.7
           and x.tokens_per_step is not None]
    ts = summarize(one)
    if ts is not None:
        print(f"accepted tokens/step at 1 stream, 0.7: {ts.fmt(2)} (facts {facts.accept:.2f})")
    print("OK" if not bad else f"{bad} cell(s) out of tolerance")
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if argv and argv[0] == "compare":
        return cmd_compare(argv[1:])
    if argv and argv[0] == "facts":
        return cmd_facts(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    return cmd_run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
