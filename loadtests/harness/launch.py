"""One launcher for the processes the tests and benchmarks start: `specrouter serve`,
`specrouter sim`, the pacer, nginx.

    child = Child("sim", cli("sim", *sim_args("mtp3", time_scale=0.05)), ready=SIM_READY).start()
    child.match.group(1)  # the URL from its "listening" line
    child.stop()

The child's output (stderr too, unless `stderr=False`) is read by a thread from the start, so a
chatty process never blocks on a full pipe; `start()` returns once the `ready` pattern matched a
line, or raises RuntimeError with the last lines it printed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from loadtests.harness.forked import Process, forked
from proxy.certs import CertFiles

SIM_READY = re.compile(r"specrouter-sim listening on (\S+)")
SERVE_READY = re.compile(r"specrouter listening on (\S+) admin (\S+)")


def cli(*args: str) -> list[str]:
    """`specrouter ARGS` run by this interpreter (so PYTHONPATH picks the code under test)."""
    return [sys.executable, "-m", "proxy.cli", *args]


def sim_args(
    profile: str,
    *,
    time_scale: float,
    port: int = 0,
    seed: int = 0,
    max_num_seqs: int | None = None,
    served_model_name: str | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments of `specrouter sim` on loopback (a tool-call parser comes with
    --enable-auto-tool-choice, as vLLM deployments that serve agents run it)."""
    args = [
        "--profile",
        profile,
        "--port",
        str(port),
        "--time-scale",
        str(time_scale),
        "--seed",
        str(seed),
    ]
    if max_num_seqs is not None:
        args += ["--max-num-seqs", str(max_num_seqs)]
    if served_model_name:
        args += ["--served-model-name", served_model_name]
    if tool_call_parser:
        args += ["--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser]
    if reasoning_parser:
        args += ["--reasoning-parser", reasoning_parser]
    return args + list(extra)


def serve_args(
    config: Path,
    state_dir: Path,
    admin_token: str,
    *,
    certs: CertFiles | None,
    scrape_interval_s: float | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """The arguments of `specrouter serve` on ephemeral loopback ports; TLS with `certs`, plain
    HTTP (`--insecure-http`, after `extra`) without."""
    args = [
        "--config",
        str(config),
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        f"--admin-token={admin_token}",
        "--state-dir",
        str(state_dir),
        # Tests send many bad keys from loopback on purpose; `extra` may set the limit back.
        "--auth-failures-per-minute",
        "100000",
    ]
    if scrape_interval_s is not None:
        args += ["--scrape-interval", str(scrape_interval_s)]
    args += list(extra)
    if certs is None:
        args.append("--insecure-http")
    else:
        args += ["--tls-cert", str(certs.cert), "--tls-key", str(certs.key)]
    return args


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent dies (Linux), so nothing leaks."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    """A process with its output kept (the last `keep` lines; all with keep=None).

    `detach`: its own session (a Ctrl-C reaches only us; we stop it) and SIGTERM when we die.
    """

    def __init__(
        self,
        name: str,
        cmd: Sequence[str],
        *,
        ready: re.Pattern[str] | None = None,
        env: dict[str, str] | None = None,
        stderr: bool = True,
        detach: bool = False,
        keep: int | None = 200,
    ) -> None:
        self.name, self.cmd, self.ready = name, list(cmd), ready
        self.env = env if env is not None else {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.stderr, self.detach, self.keep = stderr, detach, keep
        self.proc: Process | None = None
        self.output: list[str] = []
        self.match: re.Match[str] | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} not started"
        return self.proc.pid

    def start(self, timeout: float = 30.0) -> Child:
        """spawn(), then wait_ready()."""
        self.spawn()
        return self.wait_ready(timeout)

    def spawn(self) -> Child:
        # `specrouter serve` / `sim`: forked from a zygote that imported them once (forked.py).
        self.proc = forked(self.cmd, stderr=self.stderr, env=self.env, detach=self.detach)
        if self.proc is None:
            self.proc = self._popen()
        threading.Thread(target=self._pump, name=f"{self.name}-output", daemon=True).start()
        return self

    def _popen(self) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if self.stderr else None,
            stdin=subprocess.DEVNULL,
            text=True,
            env=self.env,
            start_new_session=self.detach,
            preexec_fn=_die_with_parent if self.detach else None,
        )

    def wait_ready(self, timeout: float = 30.0) -> Child:
        """Until the `ready` pattern matched a line; RuntimeError (the child killed) if the
        child exits or `timeout` passes first."""
        assert self.proc is not None, f"{self.name} not spawned"
        if self.ready is not None:
            self._ready.wait(timeout)
            if self.match is None:
                self.kill()
                self._ended.wait(2)  # the last lines it printed
                raise RuntimeError(
                    f"{self.name} did not start (exit {self.proc.poll()}):\n"
                    + "".join(self.output[-30:])
                )
        return self

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                self.output.append(line)
                if self.keep is not None:
                    del self.output[: -self.keep]
                if self.match is None and self.ready is not None:
                    self.match = self.ready.search(line)
                    if self.match is not None:
                        self._ready.set()
        except (OSError, ValueError):  # the pipe was closed under us
            pass
        finally:
            self.proc.stdout.close()  # at EOF: the child is gone; no pipe left to the collector
            self._ended.set()
            self._ready.set()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._ended.wait(5)  # its last lines read and its pipe closed

    def kill(self) -> None:
        """SIGKILL: the process dies with its connections, as a crashed one does."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        if proc is not None:
            self._ended.wait(5)
