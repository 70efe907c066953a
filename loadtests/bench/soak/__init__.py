"""The fault soak: 16 streams through the real gateway while backends fail, on a schedule.

    python -m loadtests.bench.soak                  # ~10 minutes
    python -m loadtests.bench.soak --quick          # one pass of every scenario, ~1 minute
    python -m loadtests.bench.soak --minutes 3 --json out.json

Run from the repository root (it uses `loadtests/harness/gateway.py` and `loadtests/harness/sim.py`). On
loopback only: two simulated vLLM engines serving the same weights (`deep`, dflash7; `shallow`,
mtp3), the real gateway over TLS in front of them (client `agent` goes to deep, client `other`
to shallow, continuation on, idle timeout 2 s, first-byte timeout 3 s), and one client process.
Sixteen workers send chat requests back to back (7 in 8 streamed, 50-400 tokens) for the whole
run, from a raw asyncio + httptools client with a hard deadline per request. The schedule
cycles through the scenarios until the time is up (a pass takes ~70 s); after every pass the
load pauses, the gateway must settle (in-flight 0 in the admin status and the gauge, no queued
request, no upstream socket in CLOSE_WAIT) and RSS and upstream connections are sampled.

Every request is classified from the client's side: `ok` (a complete answer: `[DONE]` once and
last, no error event; or a JSON body), `error` (an OpenAI error: an error event then `[DONE]`,
or a 4xx/5xx with `{"error": {...}}`), or `lost` (cut without `[DONE]`, a hang past the deadline,
a malformed answer, a refused connection). A request belongs to the scenario its lifetime
overlaps. Errors are expected only on the failing backend (`x-specrouter-variant`); an error
anywhere else is counted as `stray`. `lost` and `stray` must be 0.

Time to detect: from the fault to the gateway's first sign of it (the backend's health leaving
`up` in /admin/status, polled every 50 ms, or the first error a client sees on that backend); a
hung engine answers /health, so its sign is the idle timeout. Time to recover: from the fault's
end (the kill's restart, which includes the simulator's ~0.6 s start; faults cleared) to the
backend `up` again and a request served by it. One scenario turns continuation off (a policy
PUT) to show the error-event path. The bad inputs are sent once per pass, under the load, and
must each get their 4xx (or a closed connection for protocol garbage) in bounded time; the
gateway must serve after.

The gateway runs with MALLOC_MMAP_THRESHOLD_=16384 MALLOC_TRIM_THRESHOLD_=0 so that RSS follows
live memory: with glibc's defaults, each new TLS connection's buffers raise the heap's
high-water mark (tens of KB, less as it warms) and RSS climbs for thousands of connections with
no object alive. `--glibc-defaults` measures without them.

Exits 1 when any request was lost or stray, or the gateway did not settle.
"""

from loadtests.bench.soak.client import Outcome, Requester, classify_reply, iter_outcomes
from loadtests.bench.soak.load import Background, Load, burst, chat_body, disconnects, run_async
from loadtests.bench.soak.watch import HealthWatch, Settled, metric_sum, settle
from loadtests.harness.rawhttp import Address, Conn

__all__ = [
    "Background",
    "Conn",
    "HealthWatch",
    "Load",
    "Outcome",
    "Requester",
    "Settled",
    "Address",
    "burst",
    "chat_body",
    "classify_reply",
    "disconnects",
    "iter_outcomes",
    "metric_sum",
    "run_async",
    "settle",
]
