"""The recorded agent sessions (tests/fixtures/agent-recordings, made by tests/agents/record.py)
as requests to replay through the gateway, one at a time.

Each request goes as the agent sent it (method, path, headers, body), with three changes:
- the gateway's client key added (the recording keeps no secret);
- its output capped at `CAP` tokens (`max_tokens`, `max_completion_tokens`, `max_output_tokens`
  as the API names it; a Messages thinking budget, which vLLM wants at least 1024 and below
  `max_tokens`, becomes `adaptive`): the tiny model never ends, so every answer runs to its cap;
- Codex's `x-codex-turn-state` replaced by the token this gateway issued earlier in the turn
  (the recorded one was signed by the demo's gateway; Codex echoes the server's own).
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtests.harness.gateway import CLIENT_KEY, GatewayServer
from loadtests.harness.vllm import VllmServer
from tests.engines.vllm.common import logged, samples

ROOT = Path(__file__).resolve().parents[3]
RECORDINGS = ROOT / "tests" / "fixtures" / "agent-recordings"
MANIFEST = RECORDINGS / "manifest.json"
CAP = 8  # output tokens per replayed request
TURN_STATE = "x-codex-turn-state"


@dataclass(frozen=True)
class Recorded:
    session: str
    index: int
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def name(self) -> str:
        return f"{self.session}#{self.index}"

    @property
    def doc(self) -> dict[str, Any]:
        return json.loads(self.body) if self.body else {}

    @property
    def stream(self) -> bool:
        return self.doc.get("stream") is True

    @property
    def endpoint(self) -> str:
        return self.path.split("?")[0].removeprefix("/v1/")


def sessions() -> list[str]:
    return sorted(p.name.removesuffix(".jsonl.gz") for p in RECORDINGS.glob("*.jsonl.gz"))


def load(session: str) -> list[Recorded]:
    raw = gzip.decompress((RECORDINGS / f"{session}.jsonl.gz").read_bytes())
    out = []
    for i, line in enumerate(raw.splitlines()):
        r = json.loads(line)
        headers = [(k, v) for k, v in r["headers"]]
        out.append(Recorded(session, i, r["method"], r["path"], headers, r["body"].encode()))
    return out


def capped(doc: dict[str, Any], endpoint: str, cap: int = CAP) -> dict[str, Any]:
    """The body with its output capped (its other fields untouched)."""
    out = dict(doc)
    if endpoint == "responses":
        out["max_output_tokens"] = cap
    elif endpoint == "messages":
        out["max_tokens"] = cap
        thinking = out.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") == "enabled":
            # vLLM (as Anthropic) wants 1024 <= budget_tokens < max_tokens: under a cap that
            # small, the budget is left to the model (Claude Code's own `adaptive`).
            out["thinking"] = {"type": "adaptive"}
    elif endpoint == "chat/completions":
        key = "max_completion_tokens" if "max_completion_tokens" in out else "max_tokens"
        out[key] = cap
    return out


def request_of(
    rec: Recorded, key: str, turn_state: str | None, cap: int = CAP
) -> tuple[dict[str, str], bytes]:
    """(headers, body) to send for a recorded request."""
    headers = dict(rec.headers)
    headers["authorization"] = f"Bearer {key}"
    if TURN_STATE in headers and turn_state is not None:
        headers[TURN_STATE] = turn_state
    body = rec.body
    if body:
        body = json.dumps(capped(rec.doc, rec.endpoint, cap), separators=(",", ":")).encode()
    return headers, body


def manifest() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(MANIFEST.read_text())
    return doc


@dataclass
class Replayed:
    rec: Recorded
    status: int
    text: str
    delta: dict[str, float]  # the engine's /metrics samples, after less before
    row: Any  # the request log's row (None for what is not an inference request)
    wall_s: float


def send(
    c: httpx.Client, engine: VllmServer, gw: GatewayServer, rec: Recorded, turn_state: str | None
) -> tuple[Replayed, str | None]:
    """One recorded request through the gateway, alone on `engine`; the turn state to echo."""
    headers, body = request_of(rec, CLIENT_KEY, turn_state)
    before = samples(engine.metrics_text())
    t0 = time.monotonic()
    r = c.request(rec.method, rec.path, headers=headers, content=body)
    wall = time.monotonic() - t0
    after = samples(engine.metrics_text())
    delta = {k: v - before.get(k, 0.0) for k, v in after.items()}
    row = logged(gw, r.headers["x-request-id"]) if rec.path.startswith("/v1/") else None
    return Replayed(rec, r.status_code, r.text, delta, row, wall), r.headers.get(
        TURN_STATE, turn_state
    )


def replay_all(gw: GatewayServer, engine: VllmServer) -> dict[str, list[Replayed]]:
    """Every recorded session in turn, each request alone (the next waits for its answer)."""
    out: dict[str, list[Replayed]] = {}
    with gw.client() as c:
        c.timeout = httpx.Timeout(300)  # a 28K-token prefill on a loaded 2-core machine: 30 s
        for session in sessions():
            turn_state: str | None = None
            done = out.setdefault(session, [])
            for rec in load(session):
                one, turn_state = send(c, engine, gw, rec, turn_state)
                done.append(one)
    return out
