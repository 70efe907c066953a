"""`specrouter probe [run]`: its arguments."""

from __future__ import annotations

import argparse
from pathlib import Path

from proxy.helptext import DefaultsHelp

DEFAULT_CONCURRENCY = "1,2,4,8,16"
DEFAULT_TEMPERATURES = "0.7,unset"


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
        "(subcommands: run (default), compare, facts).",
        formatter_class=DefaultsHelp,
    )
    t = p.add_argument_group("target")
    t.add_argument(
        "--url", required=True, help="base URL of the gateway or of an engine (with or without /v1)"
    )
    t.add_argument("--key", default=None, help="client key (Bearer); env SPECROUTER_PROBE_KEY")
    t.add_argument(
        "--model",
        default=None,
        help="model name to request (default: the first of the target's /v1/models)",
    )
    t.add_argument(
        "--metrics-key",
        default=None,
        help="Bearer key for an engine's /metrics "
        "(llama.cpp's needs its API key); env SPECROUTER_PROBE_METRICS_KEY",
    )
    t.add_argument(
        "--metrics-url",
        action="append",
        default=[],
        help="an engine's /metrics, or the gateway's admin /metrics (repeatable; "
        "counters are summed). Default: the engine's /metrics, or the gateway's "
        "admin /metrics with --admin-url",
    )
    t.add_argument(
        "--backend",
        action="append",
        default=None,
        help="with the gateway's re-exported metrics: the backend(s) to read "
        "(default: every variant of the model's route)",
    )
    t.add_argument(
        "--admin-url",
        default=None,
        help="the gateway's admin listener: policy "
        "version, backends and their speculative configuration",
    )
    t.add_argument("--admin-token", default=None, help="env SPECROUTER_ADMIN_TOKEN")
    t.add_argument("--ca-cert", type=Path, default=None, help="CA bundle to verify TLS with")
    t.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    m = p.add_argument_group("measurement")
    m.add_argument(
        "--concurrency",
        type=_ints,
        default=_ints(DEFAULT_CONCURRENCY),
        help=f"comma-separated stream counts (default {DEFAULT_CONCURRENCY})",
    )
    m.add_argument(
        "--temperatures",
        type=_temps,
        default=_temps(DEFAULT_TEMPERATURES),
        help="comma-separated; 'unset' sends no temperature (the server's default, "
        "or the gateway's injected default)",
    )
    m.add_argument(
        "--repeats",
        type=_ints,
        default=None,
        help="runs per cell: one number for all, or one per concurrency "
        "(default 3 for 1 and 2 streams, 2 above)",
    )
    m.add_argument("--window", type=float, default=40.0, help="seconds, unscaled (40)")
    m.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds (unscaled) after every stream decodes, before the window (5)",
    )
    m.add_argument(
        "--warmup-requests",
        type=int,
        default=0,
        help="short requests per stream before the measured one, so a gateway's "
        "load rule routes the measured requests at the steady concurrency; with --admin-url "
        "the last is held open and the streams hand over one at a time (0)",
    )
    m.add_argument("--warmup-max-tokens", type=int, default=16, help="per warm-up request")
    m.add_argument(
        "--max-tokens",
        type=int,
        default=8192,
        help="per measured request; long enough to outlast the window (8192)",
    )
    m.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="do not send vLLM's ignore_eos (streams that end are re-opened)",
    )
    m.add_argument(
        "--prefill-tokens",
        type=int,
        default=12000,
        help="size of the fresh prefill prompt; 0 skips it (12000)",
    )
    m.add_argument(
        "--time-scale",
        type=float,
        default=None,
        help="the simulated backend's time scale (default: read from /version)",
    )
    m.add_argument(
        "--seed",
        type=int,
        default=0,
        help="selects the prompts (same seed: same "
        "prompts, so two configurations are measured on the same content)",
    )
    b = p.add_argument_group("bounds and output")
    b.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop (and write what was measured) before this much wall time",
    )
    b.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help="stop after this many requests (default: 4x the planned streams)",
    )
    b.add_argument("--label", default=None, help="name of the configuration in tables and plots")
    b.add_argument(
        "--out", type=Path, default=None, help="results JSON (default probe-LABEL-TIME.json)"
    )
    b.add_argument("--plot", type=Path, default=None, help="PNG (default: next to --out)")
    b.add_argument("--no-plot", action="store_true", help="no PNG beside the results file")
    b.add_argument("--quiet", action="store_true", help="no progress lines")
    return p
