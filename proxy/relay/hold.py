"""Session-aware admission on the request path: a session's turn goes to its engine, moves to
another where that pays, or waits its turn (policies/admission.py is the rule,
proxy/backends/residency.py the state). A request of no session, or a compaction or auxiliary
one, is judged as a turn too and counted while it runs (`_admit`).

A held stream gets pings at least every `PING_S` (Claude Code and Codex cut silent streams): the
API's own harmless form, an SSE comment for chat, completions and Responses, Anthropic's `ping`
event for Messages (proxy/relay/keepalive.py). A held non-streaming request waits at most the
policy's `admission.queue_timeout_s`, a held stream `sessions.stream_wait_s`; the caller
(proxy/relay/forward.py) then answers 503 with Retry-After, or the API's error event once pings
went out. Each pass reads the policy applied now: a policy that turns admission off releases
the waiting turns, and one applied meanwhile changes nothing of the state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from policies.admission import (
    BYTES_PER_TOKEN,
    Capacity,
    Turn,
    Verdict,
    admission,
    expected_wait_s,
    move_instead,
)
from policies.types import SessionView
from proxy.backends.residency import RECHECK_S
from proxy.relay.keepalive import Pinger

if TYPE_CHECKING:
    from policies.compiled import CompiledPolicy
    from proxy.relay.context import Services
    from proxy.relay.exchange import Exchange

PING_S: Final = 15.0  # a held stream's pings, at least this often


@dataclass(frozen=True, slots=True)
class Held:
    backend: str | None  # where the turn goes; None: not admitted
    timed_out: str = ""  # why it was not admitted (else the client left)


def capacity(gw: Services, policy: CompiledPolicy, name: str) -> Capacity:
    """The engine's KV tokens: the policy's, else what the engine reports, else the deployed
    budget's (`specrouter deploy render`); and max_num_seqs."""
    backend = policy.backend(name)
    kv = backend.kv_tokens
    if kv is None:
        kv = gw.kv_reported.get(name) or gw.kv_deployed(policy).get(name)
    return Capacity(kv, backend.max_concurrency)


def turn_of(x: Exchange[Any], name: str) -> Turn:
    """The turn's session (a key of its own for a request of none) and its prefix: what the
    engine held of it after its last turn there, or the request's size, whichever is larger."""
    record = x.decided.record
    row = x.gw.sessions.get(record.session) if record.session else None
    held = row.prefix_tokens if row is not None and row.engine == name else 0
    return Turn(
        record.session or _own_key(x),
        max(held, x.decided.body_bytes // BYTES_PER_TOKEN),
        record.signals.keeps_place,
        record.client,
    )


def _own_key(x: Exchange[Any]) -> str:
    """The key a request is counted under while it runs when it is not its session's turn."""
    return f"~{x.arrival.request_id[:32]}.{id(x):x}"


def _row_key(x: Exchange[Any]) -> str:
    """Where the request's tokens are counted: its session's residency for a turn, else a row
    of its own that ends with it (no session; a compaction or auxiliary request)."""
    record = x.decided.record
    return record.session if record.session and not record.signals.keeps_place else _own_key(x)


def decide_now(x: Exchange[Any], name: str, now: float) -> Verdict:
    gw = x.gw
    policy = gw.policy.current
    spec = policy.document.admission.sessions
    engine = gw.residency.snapshot(name, now, spec.place_kept_s)
    return admission(turn_of(x, name), engine, capacity(gw, policy, name), spec, now)


async def hold(x: Exchange[Any], pinger: Callable[[float], Pinger]) -> Held:
    """The decided engine, another where a move pays, or None once the wait ended without
    admission (then `timed_out` says why, or the client left)."""
    gw, record = x.gw, x.decided.record
    name = x.decided.decision.backend
    assert name is not None
    doc = gw.policy.current.document
    spec = doc.admission.sessions
    if not spec.enabled or name not in doc.backends or x.arrival.endpoint == "embeddings":
        return Held(name)  # an embedding keeps nothing in a KV cache
    metrics, residency = gw.metrics.sessions, gw.residency
    now = time.perf_counter()
    verdict = decide_now(x, name, now)
    _count(x, name, verdict)
    if verdict.admit:
        return Held(_admit(x, name))
    moved = _move(x, name, verdict, now) if record.session else None
    if moved is not None:
        metrics.waits.labels(name, "moved").inc()
        return Held(_admit(x, moved))
    stream = x.body.get("stream") is True
    if stream:
        current = x.engine.pinger
        if current is None or (current.every > PING_S and not current.started):
            if current is not None:
                current.cancel()
            x.engine.pinger = pinger(PING_S)
    policy = gw.policy.current
    limit = spec.stream_wait_s if stream else policy.document.admission.queue_timeout_s
    key = turn_of(x, name).key
    since = residency.join(name, key, now, record.client)
    metrics.waiting.labels(name).inc()
    outcome, go = "timeout", None
    try:
        while True:
            event = residency.engine(name).changed
            left = now + limit - time.perf_counter()
            if left <= 0:
                break
            try:
                await x.engine.watch.wait(asyncio.wait_for(event.wait(), min(RECHECK_S, left)))
            except TimeoutError:
                pass
            except asyncio.CancelledError:
                if not x.engine.watch.gone:
                    raise
                outcome = "client_gone"
                break
            if x.engine.watch.gone:
                outcome = "client_gone"
                break
            doc = gw.policy.current.document
            if not doc.admission.sessions.enabled or name not in doc.backends:
                outcome, go = "released", _admit(x, name)  # off, or the engine is gone
                break
            verdict = decide_now(x, name, time.perf_counter())
            if verdict.admit:
                outcome, go = "admitted", _admit(x, name)
                break
            if verdict.ends:
                residency.end(name, verdict.ends)
    finally:
        metrics.waiting.labels(name).dec()
        end = time.perf_counter()
        metrics.wait_s.labels(name).observe(end - since)
        metrics.waits.labels(name, outcome).inc()
        residency.waited(name, end - since, go is not None)
        if go is None:
            residency.leave(name, key, end, keep=bool(record.session))
    if go is not None:
        return Held(go)
    return Held(None, "" if outcome == "client_gone" else _why(name, limit, verdict))


def _admit(x: Exchange[Any], name: str) -> str:
    """The request goes to `name`, counted against its KV: a session's turn as the session's
    residency, any other request (no session, a compaction or auxiliary one) for as long as it
    runs, unless its session is resident there (it reads the prefix already counted)."""
    residency, turn = x.gw.residency, turn_of(x, name)
    row = _row_key(x)
    if row != turn.key and turn.key in residency.engine(name).residents:
        residency.dequeue(name, turn.key)
        return name
    residency.admitted(
        name,
        turn.key,
        turn.prefix_tokens,
        row=None if row == x.decided.record.session else row,  # a row of its own ends with it
        client=turn.client,
    )
    x.engine.resident = name
    return name


def _count(x: Exchange[Any], name: str, verdict: Verdict) -> None:
    x.gw.metrics.sessions.turns.labels(
        name, "admit" if verdict.admit else "wait", verdict.reason
    ).inc()
    if verdict.ends:
        x.gw.residency.end(name, verdict.ends)


def _move(x: Exchange[Any], name: str, verdict: Verdict, now: float) -> str | None:
    """Another usable engine that admits the turn now, when the stickiness arithmetic, counting
    the expected wait here, says moving pays."""
    gw, record = x.gw, x.decided.record
    policy = gw.policy.current
    spec = policy.document.admission.sessions
    candidates = [
        (other, policy.backend(other), decide_now(x, other, now))
        for other in x.decided.decision.fallbacks
        if other in policy.document.backends
    ]
    if not candidates:
        return None
    row = gw.sessions.get(record.session)
    turns = row.turns if row is not None else 0
    session = SessionView(
        record.session,
        record.subagent,
        name,
        turn_of(x, name).prefix_tokens,
        turns,
        row.tokens_out / turns if row is not None and turns else 0.0,
        gw.sessions.mean_turns(),
    )
    move = move_instead(
        session,
        name,
        policy.backend(name),
        expected_wait_s(verdict, spec),
        candidates,
        policy.sessions.default_turns,
    )
    if move is None:
        return None
    record.backend, record.reason = move.to, "session-move"
    return move.to


def _why(name: str, limit: float, verdict: Verdict) -> str:
    return (
        f"backend {name!r}: this session's turn waited {limit:g}s for the engine's KV cache "
        f"(session-aware admission: {verdict.reason}); its place is kept: retry"
    )


def turn_ended(x: Exchange[Any]) -> None:
    """The request ended, however: its residency's turn is done (a row of its own ends with
    it); a compaction ends its session's residency."""
    gw, record = x.gw, x.decided.record
    m = record.m
    if x.engine.resident is not None:
        # A new session's cached tokens are the prefix it shares with others (a system
        # prompt); a returning one's may be its own prefix, still cached.
        key = _row_key(x)
        row = gw.sessions.get(record.session) if key == record.session else None
        new = key == record.session and (row is None or row.turns == 0)
        gw.residency.turn_done(
            x.engine.resident,
            key,
            time.perf_counter(),
            prompt_tokens=m.prompt_tokens,
            completion_tokens=m.completion_tokens,
            cached_tokens=m.cached_tokens if new else None,
        )
    if record.session and record.signals.request_class == "compaction" and record.backend:
        gw.residency.compacted(record.backend, record.session)
