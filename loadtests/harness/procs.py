"""Simulated engines and a gateway as subprocesses on loopback, for the policy sweep and tests.

`SimProc("mtp3", time_scale=0.05)` runs `specrouter sim --port 0` and reads the one line it
prints once it accepts connections; `GatewayProc(policy_dict, workdir)` runs `specrouter serve`
with a local CA (TLS, as in production) and an admin token.
"""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from proxy.certs import make_local_ca

_SIM_READY = "specrouter-sim listening on "
_GW_READY = re.compile(r"specrouter listening on (\S+) admin (\S+)")
ADMIN_TOKEN = "probe-admin-token-of-thirty-two-chars"  # 32+: the gateway refuses less


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


class SimProc:
    def __init__(self, profile: str, *, time_scale: float, seed: int = 0,
                 served_model_name: str | None = None, max_num_seqs: int = 16) -> None:
        args = [sys.executable, "-m", "proxy.cli", "sim", "--profile", profile, "--port", "0",
                "--time-scale", str(time_scale), "--seed", str(seed),
                "--max-num-seqs", str(max_num_seqs)]
        if served_model_name:
            args += ["--served-model-name", served_model_name]
        self.profile = profile
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 30.0)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith(_SIM_READY):
            self.proc.kill()
            raise RuntimeError(f"specrouter sim {profile} did not start: {line!r}")
        self.url = line[len(_SIM_READY):].strip()

    def close(self) -> None:
        _stop(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SimProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GatewayProc:
    """`specrouter serve` on loopback ports with TLS from a local CA in `workdir`."""

    def __init__(self, policy: dict[str, Any], workdir: Path, *,
                 scrape_interval_s: float = 0.5) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.certs = make_local_ca(workdir / "tls")
        self.policy_path = workdir / "policy.yaml"
        self.policy_path.write_text(yaml.safe_dump(policy, sort_keys=False), encoding="utf-8")
        cmd = [sys.executable, "-m", "proxy.cli", "serve", "--config", str(self.policy_path),
               "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
               "--admin-token", ADMIN_TOKEN, "--state-dir", str(workdir / "state"),
               "--scrape-interval", str(scrape_interval_s),
               "--tls-cert", str(self.certs.cert), "--tls-key", str(self.certs.key)]
        self.output: list[str] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        assert self.proc.stdout is not None
        self.base = self.admin = ""
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if not ready:
                if self.proc.poll() is not None:
                    break
                continue
            line = self.proc.stdout.readline()
            if not line:
                break
            self.output.append(line)
            m = _GW_READY.search(line)
            if m:
                self.base, self.admin = m.group(1), m.group(2)
                break
        if not self.base:
            self.proc.kill()
            raise RuntimeError("gateway did not start:\n" + "".join(self.output[-20:]))
        threading.Thread(target=self._drain, daemon=True).start()

    @property
    def ca_cert(self) -> Path:
        return self.certs.ca_cert

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line)
            del self.output[:-200]

    def close(self) -> None:
        _stop(self.proc)

    def __enter__(self) -> GatewayProc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
