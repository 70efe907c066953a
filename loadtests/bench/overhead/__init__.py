"""What the gateway adds over direct access (and over nginx), measured in one run.

    python -m loadtests.bench.overhead            # full run, ~12 minutes (agents: ~6)
    python -m loadtests.bench.overhead --quick    # ~2 minutes
    python -m loadtests.bench.overhead --quick --only agents   # the agents' rounds, ~1 minute
    python -m loadtests.bench.overhead --json out.json
    python -m loadtests.bench.overhead --baseline-gateway ../other-checkout   # before / after
    python -m loadtests.bench.overhead.interleaved   # one-line TTFT, targets request by request
    python -m loadtests.bench.overhead.bodies   # what an agent's body adds, request by request

It starts, on loopback only:
- the pacer (`loadtests/bench/pacer.py`), a vLLM-shaped SSE backend that costs next to nothing;
- the real gateway (`specrouter serve`, TLS with a throwaway local CA) in front of it;
- nginx as a TLS reverse proxy in front of it (`proxy_buffering off`, keepalive upstream), when
  an `nginx` binary is on PATH (or in /usr/sbin); otherwise that column is skipped;
- a bare relay (bare_relay.py: Starlette + aiohttp on uvicorn and uvloop, TLS, no parsing): the
  floor of a Python gateway on the same stack (`--no-relay` skips it), and `relay_json`, the same
  relay parsing and writing the body once (the agents' rounds only: the goals' allowance);
- with `--baseline-gateway CHECKOUT`, a second gateway (`baseline`) from another checkout of
  this repository (a `git worktree` of main, say), by this interpreter with that checkout first
  on the path: today's code and the change measured in the same interleaved rounds;
and drives them from one load-client process (raw asyncio protocol + httptools on uvloop,
connections opened and kept alive before each round, so no TLS handshake falls inside a TTFT).

Rounds alternate direct / gateway / nginx within each repeat (the order rotates per repeat) and
replay the same arrival pattern on each target: agents arrive staggered (exponential gaps) and
think between requests, as coding agents do between turns. Per repeat:
- `ttft1`: one stream, short responses: TTFT p50.
- `paced16`: 16 streams, 30 ms step: TTFT p50, p99 of the gap between decode chunks, and the
  proxy's CPU per relayed chunk (utime+stime from /proc/PID/stat over the round, divided by the
  SSE events the clients received, [DONE] excluded; per-request work is included, spread over
  the response's chunks).
- `sat`: 16 streams with the pacer as fast as possible: chunks/s through the target and CPU per
  chunk, over a fixed window after a warm-up; the streams are then dropped (client disconnect).
Then the agents' rounds (agents.py): agent-sized bodies (chat with tools at 100 and 406 KiB, a
Responses and a Messages request of 406 KiB, from loadtests/bench/agent_body.py) beside one-line
prompts of the same API, at 1 and 8 streams, 10-chunk responses: added TTFT, CPU per request,
what the body adds (the body round minus the one-line round), and the overhead goals as ratios to
the bare relay and to relay_json.
And, once, right after the warm-up: `rss256`, 256 streams open at once (100 ms step), the
proxy's resident memory sampled while all 256 stream. The proxies' RSS idle (after the warm-up)
and at the end of the run are shown too: the unpaced `sat` streams are long (thousands of chunks
each), so whatever a proxy keeps per chunk of a finished request shows up there.

"Added" figures are per repeat (target round minus the direct round of the same repeat); the table
gives medians over repeats, the spread (min-max) and the run count, with the overhead targets
beside them. The machine is small and shared: read the spread, and rerun before believing a
single figure. Timing claims live here, never in the tests.
"""

from loadtests.bench.overhead.client import iter_frames
from loadtests.bench.overhead.report import render, summarize
from loadtests.bench.overhead.rounds import Bench, Spec
from loadtests.bench.overhead.stack import BENCH_KEY, Stack

__all__ = ["BENCH_KEY", "Bench", "Spec", "Stack", "iter_frames", "render", "summarize"]
