"""A real `specrouter sim` process on loopback, for tests.

    with SimServer("dflash7-prob-block") as sim:
        httpx.get(f"{sim.url}/health")
        sim.fault("die_mid_stream", after_chunks=3)
        sim.stats()["aborted"]

The server binds an ephemeral port (`--port 0`) and prints one line once it accepts connections;
`restart()` brings it back on the same port after `kill()`.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import httpx

_READY = "specrouter-sim listening on "
START_TIMEOUT_S = 20.0


class SimServer:
    def __init__(
        self,
        profile: str = "dflash7-prob-block",
        *,
        served_model_name: str | None = None,
        time_scale: float = 0.05,
        seed: int = 0,
        spec_metrics: str = "none",
        faults: bool = True,
        max_num_seqs: int = 16,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.profile = profile
        self.served_model_name = served_model_name
        self.time_scale = time_scale
        self.seed = seed
        self.spec_metrics = spec_metrics
        self.faults = faults
        self.max_num_seqs = max_num_seqs
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.port = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> SimServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._spawn(self.port)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    def kill(self) -> None:
        """SIGKILL: the process dies with its connections, as a crashed engine does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def restart(self) -> None:
        """Start again on the same port (after kill(), or to reset all state)."""
        self.stop()
        self._spawn(self.port)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def _args(self, port: int) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "proxy.cli",
            "sim",
            "--profile",
            self.profile,
            "--port",
            str(port),
            "--time-scale",
            str(self.time_scale),
            "--seed",
            str(self.seed),
            "--per-request-spec-decode-metrics",
            self.spec_metrics,
            "--max-num-seqs",
            str(self.max_num_seqs),
        ]
        if self.served_model_name:
            args += ["--served-model-name", self.served_model_name]
        if self.faults:
            args.append("--faults")
        return args + list(self.extra_args)

    def _spawn(self, port: int) -> None:
        proc = subprocess.Popen(
            self._args(port),
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select(
                [proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                break
            line = proc.stdout.readline()
            if line.startswith(_READY) or not line:
                break
        if not line.startswith(_READY):
            proc.kill()
            proc.wait(5)
            raise RuntimeError(f"specrouter sim did not start (exit={proc.poll()}, said {line!r})")
        self.proc = proc
        self.url = line[len(_READY) :].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    # -- control -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        resp = httpx.get(f"{self.url}/_sim/stats", timeout=5)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def fault(self, mode: str, **params: Any) -> dict[str, Any]:
        resp = httpx.post(f"{self.url}/_sim/faults", json={"mode": mode, **params}, timeout=5)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def clear_faults(self) -> None:
        httpx.delete(f"{self.url}/_sim/faults", timeout=5).raise_for_status()


def sse_data(raw: bytes) -> list[bytes]:
    """The `data:` payloads of an SSE body, in order (`[DONE]` included), for assertions."""
    assert raw.endswith(b"\n\n") or not raw, "stream must end on a frame boundary"
    out: list[bytes] = []
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(line[len(b"data: ") :])
    return out
