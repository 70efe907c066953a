"""What the real-vLLM tests share: request bodies, the engine's counters, the client's clock,
what the gateway's index of the engine's KV events says of a session."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from loadtests.harness.gateway import ADMIN_TOKEN, GatewayServer
from tests.engines.client_clock import raw_stream
from tests.engines.test_llamacpp_gateway import logged

__all__ = ["logged"]

CHAT = [{"role": "user", "content": "Write a function that returns the length of a list."}]
PROMPT = "def add(a, b):\n    return a + b\n\nclass Stack:\n    def push(self, value):"
GREEDY = {"temperature": 0, "seed": 1234}


def samples(page: str) -> dict[str, float]:
    """Every sample of a Prometheus page, summed over its labels, by sample name."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def timed_stream(
    gw: GatewayServer, body: dict[str, Any], rid: str
) -> tuple[float, list[tuple[float, int]]]:
    """(the client's TTFT, [(arrival, tokens) per content frame]) for a chat stream with
    per-chunk usage, on the client's clock at each frame's first byte (a raw TLS socket)."""
    t0, reply = raw_stream(gw, body, rid)
    frames: list[tuple[float, int]] = []
    offset, seen = 0, 0
    for frame in bytes(reply.body).split(b"\n\n"):
        if frame.startswith(b"data: {"):
            doc = json.loads(frame[6:])
            usage = doc.get("usage") or {}
            tokens = int(usage.get("completion_tokens") or 0)
            if doc.get("choices") and tokens > seen:
                frames.append((reply.at(offset), tokens - seen))
                seen = tokens
        offset += len(frame) + 2
    return frames[0][0] - t0, frames


def per_token_itl_p50(frames: list[tuple[float, int]]) -> float:
    """The weighted median of gap/tokens over the decode frames (the gateway's definition)."""
    values: list[float] = []
    for (a, _), (b, n) in zip(frames, frames[1:], strict=False):
        values += [(b - a) / n] * n
    values.sort()
    pos = 0.5 * (len(values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def resident_tokens(gw: GatewayServer, session: str) -> int | None:
    """The session's resident prefix on its engine, as the gateway's index of the engine's KV
    events has it now (`POST /admin/policy/explain`'s `session.resident_tokens`)."""
    resp = httpx.post(
        gw.admin + "/admin/policy/explain",
        headers={"authorization": f"Bearer {ADMIN_TOKEN}"},
        json={"request": {"model": "any", "messages": CHAT}, "session": session},
        timeout=10,
    )
    resp.raise_for_status()
    found: int | None = resp.json()["session"]["resident_tokens"]
    return found


def kv_events(gw: GatewayServer, backend: str, what: str) -> float:
    """specrouter_kv_events_total{backend, what}: batches applied, restarts seen, ..."""
    line = f'specrouter_kv_events_total{{backend="{backend}",what="{what}"}} '
    found = [ln for ln in gw.metrics().splitlines() if ln.startswith(line)]
    return float(found[0].split()[-1]) if found else 0.0


def wait_for(check: Any, timeout: float) -> bool:
    """Until `check()` is true (polled every 0.1 s), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False
