"""`specrouter probe pair`: two engines of one device, loaded alone and then at once.

    specrouter probe pair --a http://127.0.0.1:8001 --b http://127.0.0.1:8002 \\
        [--concurrency 4] [--temperature 0.7] [--window 40] [--out pair.json]

Straight at the engines (each engine's own /metrics counts its tokens), one cell of the probe's
method three times: A alone, B alone, then A and B together, on the same prompts. Each
engine's slowdown is its rate alone over its rate together, in target steps per second
(tokens/s over accepted tokens per step: acceptance depends on content, not on contention).
The simulator's device model (loadtests/sim/device.py) says a step of one of two busy engines takes 1 + (1 - overlap) times
as long, so overlap = 2 - slowdown, clamped to 0..1, is the figure to give `specrouter sim
--overlap` once measured on a GB10. Against `specrouter sim --engine ...` it reads the time
scale from /version and gives back the overlap the simulator ran with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import httpx

from loadtests.probe.config import MetricsSource, ProbeConfig, RunResult
from loadtests.probe.run import Probe
from proxy.helptext import DefaultsHelp


def overlap_from(alone: float, together: float) -> float | None:
    """The device model's overlap from one engine's tokens/s alone and with its neighbour busy."""
    if alone <= 0 or together <= 0:
        return None
    return min(1.0, max(0.0, 2.0 - alone / together))


def step_rate(run: RunResult) -> float:
    """Address steps per second: contention slows steps, while what a step accepts depends on
    the content; tokens/s where the engine does not speculate."""
    return run.tok_s / run.tokens_per_step if run.tokens_per_step else run.tok_s


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="specrouter probe pair",
        description=__doc__.split("\n")[0],
        formatter_class=DefaultsHelp,
    )
    p.add_argument("--a", required=True, help="first engine's base URL")
    p.add_argument("--b", required=True, help="second engine's base URL (same device)")
    p.add_argument("--key", default=None, help="the engines' API key (default: none)")
    p.add_argument("--model", default=None, help="served model name (default: from /v1/models)")
    p.add_argument("--concurrency", type=int, default=4, help="streams per engine")
    p.add_argument("--temperature", type=float, default=0.7, help="of every request")
    p.add_argument("--window", type=float, default=40.0, help="unscaled seconds")
    p.add_argument("--time-scale", type=float, default=None, help="default: from /version")
    p.add_argument("--insecure", action="store_true", help="do not verify TLS")
    p.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    return p


async def _discover(url: str, args: argparse.Namespace) -> tuple[str, float]:
    headers = {"authorization": f"Bearer {args.key}"} if args.key else {}
    async with httpx.AsyncClient(verify=not args.insecure, headers=headers, timeout=10) as c:
        model = args.model or (await c.get(f"{url}/v1/models")).json()["data"][0]["id"]
        scale = args.time_scale
        if scale is None:
            info = (await c.get(f"{url}/version")).json()
            scale = float((info.get("specrouter_sim") or {}).get("time_scale", 1.0))
    return str(model), scale


def _config(url: str, model: str, scale: float, args: argparse.Namespace) -> ProbeConfig:
    return ProbeConfig(
        url=url,
        model=model,
        key=args.key,
        sources=[MetricsSource(f"{url}/metrics")],
        concurrency=[args.concurrency],
        temperatures=[args.temperature],
        window_s=args.window,
        warmup_s=2.0,
        prefill_tokens=0,
        time_scale=scale,
        verify=not args.insecure,
    )


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    urls = {"a": args.a.rstrip("/"), "b": args.b.rstrip("/")}
    found = {k: await _discover(u, args) for k, u in urls.items()}
    probes = {k: Probe(_config(urls[k], *found[k], args)) for k in urls}
    n, t = args.concurrency, args.temperature
    alone: dict[str, RunResult] = {}
    for k, probe in probes.items():
        print(f"{k} alone: {n} stream(s) on {urls[k]}", file=sys.stderr, flush=True)
        alone[k] = await probe.run_once(n, t, 0, f"{k} alone")
    print(f"a and b together: {n} stream(s) each", file=sys.stderr, flush=True)
    # The same prompts as alone (run 0): the same content, so acceptance does not differ.
    both = await asyncio.gather(*(p.run_once(n, t, 0, f"{k} together") for k, p in probes.items()))
    together = dict(zip(probes, both, strict=True))
    out: dict[str, Any] = {
        "concurrency": n,
        "temperature": t,
        "window_s": args.window,
        "time_scale": {k: f[1] for k, f in found.items()},
        "engines": {},
    }
    overlaps = []
    for k in probes:
        a, b = alone[k].tok_s, together[k].tok_s
        sa, sb = step_rate(alone[k]), step_rate(together[k])
        ov = overlap_from(sa, sb)
        if ov is not None:
            overlaps.append(ov)
        out["engines"][k] = {
            "url": urls[k],
            "alone_tok_s": a,
            "together_tok_s": b,
            "alone_steps_s": sa,
            "together_steps_s": sb,
            "slowdown": sa / sb if sb else None,
            "overlap": ov,
        }
    out["overlap"] = sum(overlaps) / len(overlaps) if overlaps else None
    return out


def cmd_pair(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    result = asyncio.run(measure(args))
    for k, e in result["engines"].items():
        slow = "-" if e["slowdown"] is None else f"{e['slowdown']:.2f}x"
        print(
            f"{k}: {e['alone_tok_s']:.1f} tokens/s alone, {e['together_tok_s']:.1f} together "
            f"({slow} slower)"
        )
    ov = result["overlap"]
    print(f"device overlap (specrouter sim --overlap): {'-' if ov is None else f'{ov:.2f}'}")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0 if ov is not None else 1
