"""A real `specrouter sim` process on loopback, for tests.

    with SimServer("dflash7-prob-block") as sim:
        httpx.get(f"{sim.url}/health")
        sim.fault("die_mid_stream", after_chunks=3)
        sim.stats()["aborted"]

The server binds an ephemeral port (`--port 0`) and prints one line once it accepts connections;
`restart()` brings it back on the same port after `kill()`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import httpx

from loadtests.harness.forked import Process
from loadtests.harness.launch import SIM_READY, Child, cli, sim_args

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
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        vllm_version: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        # The per-request summary is a 0.29+ flag: asking for it picks 0.33.0 unless told.
        self.vllm_version = vllm_version or ("0.33.0" if spec_metrics == "summary" else None)
        self.profile = profile
        self.served_model_name = served_model_name
        self.time_scale = time_scale
        self.seed = seed
        self.spec_metrics = spec_metrics
        self.faults = faults
        self.max_num_seqs = max_num_seqs
        self.tool_call_parser = tool_call_parser
        self.reasoning_parser = reasoning_parser
        self.extra_args = tuple(extra_args)
        self.proc: Process | None = None
        self._child: Child | None = None
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
        child, self._child, self.proc = self._child, None, None
        if child is not None:
            child.stop(timeout=5)

    def kill(self) -> None:
        """SIGKILL: the process dies with its connections, as a crashed engine does."""
        if self._child is not None:
            self._child.kill()

    def restart(self) -> None:
        """Start again on the same port (after kill(), or to reset all state)."""
        self.stop()
        self._spawn(self.port)

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    def _args(self, port: int) -> list[str]:
        extra = (
            []
            if self.spec_metrics == "none"
            else ["--per-request-spec-decode-metrics", self.spec_metrics]
        )
        if self.vllm_version is not None:
            extra += ["--vllm-version", self.vllm_version]
        if self.faults:
            extra.append("--faults")
        return cli(
            "sim",
            *sim_args(
                self.profile,
                port=port,
                time_scale=self.time_scale,
                seed=self.seed,
                max_num_seqs=self.max_num_seqs,
                served_model_name=self.served_model_name,
                tool_call_parser=self.tool_call_parser,
                reasoning_parser=self.reasoning_parser,
                extra=[*extra, *self.extra_args],
            ),
        )

    def _spawn(self, port: int) -> None:
        child = Child("specrouter sim", self._args(port), ready=SIM_READY, stderr=False)
        self._child = child.start(timeout=START_TIMEOUT_S)
        assert child.match is not None
        self.proc = child.proc
        self.url = child.match.group(1)
        self.port = int(self.url.rsplit(":", 1)[1])

    # -- control -------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        resp = httpx.get(f"{self.url}/_sim/stats", timeout=5)
        resp.raise_for_status()
        data: dict[str, Any] = resp.json()
        return data

    def traceparents(self) -> dict[str, str]:
        """The `traceparent` each recent request came with, by its `x-request-id`."""
        resp = httpx.get(f"{self.url}/_sim/traceparents", timeout=5)
        resp.raise_for_status()
        data: dict[str, str] = resp.json()
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
