"""How good the gateway's "chunks" estimate of tokens per step is:
`python -m loadtests.bench.estimate [--quick] [--rounds R] [--frontend-chunk-ms MS]`.

A simulated engine in vLLM 0.28 mode (no per-request summary: the gateway's only figure is its
count of tokens per chunk, proxy/relay/measure.py) behind the real gateway. Each cell runs
`--rounds` rounds of N concurrent chat streams (N = 1, 4, 16), with and without the simulator's
output-merging model (`--frontend-chunk-ms`: a MODEL of vLLM's API server falling behind, not a
measurement of vLLM). The truth is the simulator's own per request: its accepted draft tokens
and target steps (`/_sim/requests`, a test-only endpoint), tokens per step = (tokens - 1) /
steps (docs/tokens-per-step.md). The estimate is the request log's `tokens_per_step` where `tps_source` is "chunks";
a request whose estimate the gateway withheld (a chunk of more than num_speculative_tokens + 1
tokens: outputs merged) counts in the withheld share, not in the error.

Prints one row per cell: requests, withheld share, mean absolute and mean signed relative
error of the estimate. A benchmark of this machine and the simulator, not of vLLM.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import httpx

from loadtests.harness.gateway import GatewayServer, coder_policy
from loadtests.harness.requestlog import logged_rows
from loadtests.harness.sim import SimServer

SERVED = "qwen3.8-27b"
PROFILE = "mtp3"  # MTP, 3 draft tokens: a chunk of up to 4 tokens is one step
NUM_SPEC = 3
VLLM = "0.28.0"
PROMPT = "Write a function that parses `src/app/{}.py`."  # one file per request: its own text
CONCURRENCY = (1, 4, 16)
FRONTEND_CHUNK_MS = 10.0


@dataclass(slots=True)
class Cell:
    concurrency: int
    merging: bool
    requests: int = 0
    withheld: int = 0
    rel_errors: list[float] | None = None

    @property
    def key(self) -> str:
        return f"c{self.concurrency}-{'merge' if self.merging else 'plain'}"

    @property
    def withheld_share(self) -> float:
        return self.withheld / self.requests if self.requests else math.nan

    @property
    def mean_abs(self) -> float:
        errs = self.rel_errors or []
        return statistics.fmean(abs(e) for e in errs) if errs else math.nan

    @property
    def mean_signed(self) -> float:
        errs = self.rel_errors or []
        return statistics.fmean(errs) if errs else math.nan


def _stream(gw: GatewayServer, rid: str, max_tokens: int, errors: list[str]) -> None:
    messages = [{"role": "user", "content": PROMPT.format(rid)}]
    body = {"model": "coder", "messages": messages, "stream": True, "max_tokens": max_tokens}
    try:
        with gw.client() as c:
            with c.stream(
                "POST", "/v1/chat/completions", json=body, headers={"x-request-id": rid}
            ) as r:
                for _ in r.iter_raw():
                    pass
                if r.status_code != 200:
                    errors.append(f"{rid}: {r.status_code}")
    except httpx.HTTPError as exc:
        errors.append(f"{rid}: {exc!r}")


def _rows(gw: GatewayServer, ids: set[str]) -> dict[str, dict[str, Any]]:
    return logged_rows(gw.dir / "state", ids, "tokens_per_step, tps_source")


def _truth(sim: SimServer) -> dict[str, float]:
    """Tokens per target step of each finished request, by the client's request id: the one
    definition (proxy/record/steps.py), (tokens - 1) / decode steps. The simulated engine drafts
    at every decode step, so its drafted steps are its decode steps (1 + accepted / steps would
    count the drafts accepted past `max_tokens`)."""
    resp = httpx.get(f"{sim.url}/_sim/requests", timeout=5)
    resp.raise_for_status()
    out: dict[str, float] = {}
    for sim_id, c in resp.json().items():
        steps = c["num_spec_steps"]
        if steps > 0:  # the sim names it `<endpoint prefix>-<x-request-id>`
            out[sim_id.split("-", 1)[1]] = (c["num_generated"] - 1) / steps
    return out


def run_cells(
    merging: bool,
    concurrencies: tuple[int, ...],
    rounds: int,
    max_tokens: int,
    time_scale: float,
    chunk_ms: float,
) -> list[Cell]:
    extra = ["--frontend-chunk-ms", str(chunk_ms)] if merging else []
    policy = coder_policy({"coder-a": "http://127.0.0.1:1"}, served=SERVED)
    cells: list[Cell] = []
    with SimServer(
        PROFILE,
        served_model_name=SERVED,
        time_scale=time_scale,
        faults=True,  # the /_sim/ endpoints, truth included; no fault is set
        vllm_version=VLLM,
        extra_args=extra,
    ) as sim:
        policy["backends"]["coder-a"]["url"] = sim.url
        policy["backends"]["coder-a"]["speculative"] = {
            "method": "mtp",
            "num_speculative_tokens": NUM_SPEC,
        }
        with GatewayServer(policy) as gw:
            for n in concurrencies:
                cell = Cell(n, merging, rel_errors=[])
                ids: set[str] = set()
                errors: list[str] = []
                for r in range(rounds):
                    batch = [f"est-{cell.key}-r{r}-{i}" for i in range(n)]
                    threads = [
                        threading.Thread(target=_stream, args=(gw, rid, max_tokens, errors))
                        for rid in batch
                    ]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                    ids.update(batch)
                if errors:
                    raise RuntimeError(f"{cell.key}: {errors[:3]}")
                rows, truth = _rows(gw, ids), _truth(sim)
                assert cell.rel_errors is not None
                for rid in sorted(ids):
                    row, true = rows.get(rid), truth.get(rid)
                    if row is None or true is None:
                        continue
                    cell.requests += 1
                    if row["tps_source"] != "chunks" or row["tokens_per_step"] is None:
                        cell.withheld += 1
                    else:
                        cell.rel_errors.append((row["tokens_per_step"] - true) / true)
                cells.append(cell)
    return cells


def table(cells: list[Cell], rounds: int, chunk_ms: float) -> str:
    lines = [
        "| streams | merging model | requests (rounds) | withheld | mean abs rel err | mean signed rel err |",
        "|---|---|---|---|---|---|",
    ]
    for c in cells:
        lines.append(
            f"| {c.concurrency} | {f'{chunk_ms:g} ms/chunk' if c.merging else 'off'} "
            f"| {c.requests} ({rounds}) | {c.withheld_share:.0%} "
            f"| {c.mean_abs:.2%} | {c.mean_signed:+.2%} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="one cell (1 stream, no merging)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds per cell (default 6)")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--time-scale", type=float, default=0.1)
    ap.add_argument("--frontend-chunk-ms", type=float, default=FRONTEND_CHUNK_MS)
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 6)
    t0 = time.monotonic()
    cells: list[Cell] = []
    for merging in (False,) if args.quick else (False, True):
        cells += run_cells(
            merging,
            (1,) if args.quick else CONCURRENCY,
            rounds,
            args.max_tokens,
            args.time_scale,
            args.frontend_chunk_ms,
        )
    print(
        f"# chunk estimate vs the simulator's truth: {PROFILE}, vLLM {VLLM} mode, "
        f"time scale {args.time_scale:g}, max_tokens {args.max_tokens}, "
        f"{time.monotonic() - t0:.0f} s"
    )
    print(table(cells, rounds, args.frontend_chunk_ms))
    return 0


if __name__ == "__main__":
    sys.exit(main())
