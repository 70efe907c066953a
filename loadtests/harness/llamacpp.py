"""A real llama.cpp server (xllamacpp's, in its own process) on loopback, for tests.

    target, draft = tiny_pair(cache_dir)
    with LlamaCppServer(target, draft=draft, n_max=8, api_key="k") as server:
        httpx.post(f"{server.url}/v1/completions", json=..., headers=server.headers)

The child (`python -m loadtests.harness.llamacpp --model ... [--draft ...] --port 0`) starts
llama.cpp's HTTP server in-process, prints one line with the address it bound, and serves until
SIGTERM. Every server binds 127.0.0.1. Speculative settings are per server: llama.cpp ignores a
request's `speculative.*` fields, so each configuration needs its own process.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

_READY = "llamacpp listening on "
START_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


class LlamaCppServer:
    def __init__(
        self,
        model: Path | str,
        *,
        draft: Path | str | None = None,
        n_max: int = 8,
        api_key: str | None = None,
        threads: int = 1,
        metrics: bool = True,
        embeddings: bool = False,
        parallel: int = 1,
        ctx_size: int = 1024,
        port: int = 0,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.model = Path(model)
        self.draft = Path(draft) if draft is not None else None
        self.n_max = n_max
        self.api_key = api_key
        self.threads = threads
        self.metrics = metrics
        self.embeddings = embeddings
        self.parallel = parallel
        self.ctx_size = ctx_size
        self.port = port
        self.extra_args = tuple(extra_args)
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.start_s = 0.0  # spawn to /health 200, for the record

    # -- lifecycle -----------------------------------------------------------------------------

    def __enter__(self) -> LlamaCppServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        began = time.monotonic()
        self._spawn()
        self._wait_healthy(began + START_TIMEOUT_S)
        self.start_s = time.monotonic() - began

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _args(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            "loadtests.harness.llamacpp",
            "--model",
            str(self.model),
            "--port",
            str(self.port),
            "--threads",
            str(self.threads),
            "--parallel",
            str(self.parallel),
            "--ctx-size",
            str(self.ctx_size),
            "--n-max",
            str(self.n_max),
        ]
        if self.draft is not None:
            args += ["--draft", str(self.draft)]
        if self.api_key:
            args += ["--api-key", self.api_key]
        if not self.metrics:
            args.append("--no-metrics")
        if self.embeddings:
            args.append("--embeddings")
        return args + list(self.extra_args)

    def _spawn(self) -> None:
        proc = subprocess.Popen(
            self._args(),
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
            raise RuntimeError(
                f"llama.cpp server did not start (exit={proc.poll()}, said {line!r})"
            )
        self.proc = proc
        self.url = line[len(_READY) :].strip()
        self.port = int(self.url.rsplit(":", 1)[1])

    def _wait_healthy(self, deadline: float) -> None:
        # /health answers 503 while the model loads; it needs no api key.
        status = 0
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"{self.url}/health", timeout=2).status_code
            except httpx.TransportError:
                status = 0
            if status == 200:
                return
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"llama.cpp server never became healthy (last status {status})")

    # -- requests ------------------------------------------------------------------------------

    def post(self, path: str, body: dict[str, Any], timeout: float = 60) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, headers=self.headers, timeout=timeout)

    def metrics_text(self) -> str:
        resp = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=5)
        resp.raise_for_status()
        return resp.text


# -- the child process ---------------------------------------------------------------------------


def _start_server(args: argparse.Namespace) -> Any:
    """llama.cpp's server, listening once this returns (the model is loaded by then)."""
    import xllamacpp as xlc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    p = xlc.CommonParams()
    p.model.path = args.model
    p.hostnames = [HOST]
    p.port = args.port
    p.n_ctx = args.ctx_size
    p.n_parallel = args.parallel
    p.endpoint_metrics = args.metrics
    if args.api_key:
        p.api_keys = [args.api_key]
    # One compute thread per model: timings stay comparable on a shared, small machine.
    p.cpuparams.n_threads = args.threads
    p.cpuparams_batch.n_threads = args.threads
    if args.embeddings:
        p.embedding = True
        p.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_MEAN
    if args.draft:
        spec = p.speculative
        spec.draft.mparams.path = args.draft
        # A draft path alone loads the draft model but never drafts: the type must be named.
        spec.types = [xlc.common_speculative_type.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
        spec.draft.n_max = args.n_max
        spec.draft.cpuparams.n_threads = args.threads
        spec.draft.cpuparams_batch.n_threads = args.threads
    return xlc.Server(p)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="llama.cpp's server (xllamacpp) on loopback")
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", default=None, help="draft GGUF: speculative decoding on")
    parser.add_argument("--n-max", type=int, default=8, help="most draft tokens per step")
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--parallel", type=int, default=1, help="slots (concurrent requests)")
    parser.add_argument("--ctx-size", type=int, default=1024)
    parser.add_argument("--no-metrics", dest="metrics", action="store_false")
    parser.add_argument("--embeddings", action="store_true")
    args = parser.parse_args(argv)
    # Block the stop signals before the server's threads start, so only sigwait sees them.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    server = _start_server(args)
    print(f"{_READY}{server.listening_address}", flush=True)
    signal.sigwait(stop_signals)
    del server  # joins llama.cpp's loop and HTTP threads


if __name__ == "__main__":
    main()
