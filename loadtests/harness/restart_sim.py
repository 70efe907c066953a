"""A repair command for tests: start a simulated engine on PORT, detached, like `docker
restart` brings a container back, and record its pid in PIDFILE so the test can stop it."""

from __future__ import annotations

import subprocess
import sys

port, pidfile, profile = sys.argv[1], sys.argv[2], sys.argv[3]
proc = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "proxy.cli",
        "sim",
        "--port",
        port,
        "--profile",
        profile,
        "--served-model-name",
        "qwen3.8-27b",
        "--time-scale",
        "0.02",
        "--faults",
    ],
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
    start_new_session=True,
)
with open(pidfile, "a") as f:
    f.write(f"{proc.pid}\n")
