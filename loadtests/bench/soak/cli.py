"""`python -m loadtests.bench.soak`: the command line."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import loadtests.bench.soak as package
from loadtests.bench.soak.report import render
from loadtests.bench.soak.runner import Soak


def _install_signals() -> None:
    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m loadtests.bench.soak",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minutes", type=float, default=10.0, help="soak length (default 10)")
    p.add_argument("--quick", action="store_true", help="one pass of every scenario (~1 min)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--glibc-defaults",
        action="store_true",
        help="run the gateway with glibc's default allocator settings (RSS then also "
        "shows freed memory glibc keeps)",
    )
    args = p.parse_args(argv)
    if args.minutes <= 0 or args.minutes > 240:
        p.error("--minutes must be in (0, 240]")
    _install_signals()
    if not Path("loadtests/harness/gateway.py").exists():
        p.error("run from the repository root (needs loadtests/harness/gateway.py)")
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    soak = Soak(
        minutes=args.minutes,
        quick=args.quick,
        seed=args.seed,
        lean_malloc=not args.glibc_defaults,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    )
    started = time.monotonic()
    # A hard bound on the whole run, whatever hangs: the schedule, plus a pass, plus slack.
    limit = args.minutes * 60 + 300 if not args.quick else 600
    timer = threading.Timer(limit, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.daemon = True
    timer.start()
    try:
        soak.run()
    finally:
        timer.cancel()
    report = soak.report()
    report["wall_s"] = round(time.monotonic() - started, 1)
    failures = soak.failed()
    report["failures"] = failures
    print(render(report))
    if failures:
        print("\nFAILED:\n" + "\n".join(f"- {f}" for f in failures))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 1 if failures else 0
