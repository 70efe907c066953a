"""The built-in live dashboard: a static page fed by a once-a-second SSE snapshot.

Served on the admin listener. A browser cannot send a bearer header on navigation, so the
page logs in by a POST form (proxy/admin/login.py); scripts may send the token as a bearer header.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from importlib import resources
from operator import truediv
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from proxy.admin.identity import Denied
from proxy.admin.login import login_form, login_routes, refused, viewer
from proxy.admin.policy_store import PolicyStore
from proxy.admin.residency_view import residency_rows
from proxy.backends.health import HealthMonitor
from proxy.gateway import Gateway
from proxy.observe.stats import quantile, weighted_quantile
from proxy.record.request import RequestRecord
from proxy.record.steps import StepCount, pooled

VARIANT_WINDOW_S = 300.0
_ROWS = ("in_flight", "recent", "variants", "agents", "backends", "admission", "repairs", "events")
_SHOWN = 50  # rows of a list the page shows at most (in-flight sessions, say)


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 2)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _record_row(r: RequestRecord) -> dict[str, Any]:
    m = r.m
    gaps, tokens = m.itl_steps()
    itl = list(map(truediv, gaps, tokens))  # per step, weighted by its tokens: never expanded
    return {
        "time": r.started_wall,
        "id": r.request_id[:12],
        "client": r.client,
        "agent": r.agent,
        "route": r.route,
        "variant": r.backend,
        "reason": r.reason,
        "canary": r.canary,
        "temperature": r.temperature,
        "temperature_default": r.temperature_defaulted,
        "ttft_ms": _ms(m.ttft),
        "itl_p50_ms": _ms(weighted_quantile(itl, tokens, 0.5)),
        "itl_p95_ms": _ms(weighted_quantile(itl, tokens, 0.95)),
        "tokens_per_step": _round(m.acceptance),
        "tps_source": m.tps_source,
        "tokens": m.completion_tokens,
        "e2e_s": None if m.e2e is None else round(m.e2e, 2),
        "outcome": r.outcome,
        "finish": m.finish_reason,
    }


def _agent_rows(gw: Gateway) -> list[dict[str, Any]]:
    """The most recently active sessions (the session table's rows, at most _SHOWN), each with
    its charts' series. The share of the engine: its completion tokens over all its engine
    returned in the charts' window (a session that moved counts all its tokens there)."""
    timeline, now = gw.timeline, time.perf_counter()
    engine_tokens: dict[str, int] = {}
    rows, keys = [], []
    for key, e in gw.sessions.recent(_SHOWN):
        keys.append(key)
        if e.engine not in engine_tokens:
            engine_tokens[e.engine] = timeline.tokens("variants", e.engine)
        total, label = engine_tokens[e.engine], timeline.labels.get(key)
        rows.append(
            {
                "session": key,  # the hash the request log stores, never the agent's own id
                "agent": label.agent if label else e.source + ("/subagent" if e.subagent else ""),
                "client": e.client,
                "engine": e.engine,
                "moves": e.moves,
                "requests": e.turns,
                "tokens_in": e.tokens_in,
                "tokens_out": e.tokens_out,
                "cached_tokens": e.cached_tokens if label and label.cache_reported else None,
                "lost_tokens": e.lost_tokens,  # proxy/backends/prefix.py
                "loss_cause": e.loss_cause,
                "loss_where": e.loss_where,
                "decode_s": round(e.decode_s, 2),
                "engine_share": (
                    round(min(1.0, timeline.tokens("agents", key) / total), 3) if total else None
                ),
                "idle_s": round(now - e.last_seen, 1),
            }
        )
    series = timeline.series("agents", keys)
    for key, row in zip(keys, rows, strict=True):
        row["series"] = series[key]
    return rows


def snapshot(
    gw: Gateway, monitor: HealthMonitor | None, store: PolicyStore | None
) -> dict[str, Any]:
    now_perf, now_wall = time.perf_counter(), time.time()
    in_flight = []
    for r in list(gw.in_flight.values()):
        m = r.m
        elapsed = now_perf - m.t_start
        decode_s = (m.t_last_token - m.t_first_token) if m.t_first_token and m.t_last_token else 0
        tps = (m.completion_tokens - 1) / decode_s if decode_s > 0 else None
        in_flight.append(
            {
                "id": r.request_id[:12],
                "client": r.client,
                "route": r.route,
                "variant": r.backend,
                "reason": r.reason,
                "elapsed_s": round(elapsed, 2),
                "tokens": m.completion_tokens,
                "tokens_per_s": None if tps is None else round(tps, 1),
                "ttft_ms": _ms(m.ttft),
            }
        )
    recent = list(gw.recent)
    variants: dict[str, dict[str, list[float]]] = {}
    counts: dict[str, list[StepCount]] = {}  # per backend, for tokens per step pooled
    itl_weights: dict[str, list[int]] = {}
    for r in recent:
        if now_wall - r.started_wall > VARIANT_WINDOW_S or r.outcome != "ok" or not r.backend:
            continue
        v = variants.setdefault(r.backend, {"n": [], "ttft": [], "itl": []})
        v["n"].append(1.0)
        if r.m.ttft is not None:  # streams only: a non-streaming request has no TTFT
            v["ttft"].append(r.m.ttft)
        gaps, tokens = r.m.itl_steps()  # each step's ITL weighted by its tokens (O(steps))
        v["itl"] += map(truediv, gaps, tokens)
        itl_weights.setdefault(r.backend, []).extend(tokens)
        count = r.m.step_count
        if count is not None:
            counts.setdefault(r.backend, []).append(count)
    per_step = {name: pooled(c) for name, c in counts.items()}
    variant_rows = [
        {
            "variant": name,
            "requests": len(v["n"]),
            "streams": len(v["ttft"]),
            "ttft_p50_ms": _ms(quantile(v["ttft"], 0.5)),
            "ttft_p95_ms": _ms(quantile(v["ttft"], 0.95)),
            "itl_p50_ms": _ms(weighted_quantile(v["itl"], itl_weights.get(name, []), 0.5)),
            "itl_p95_ms": _ms(weighted_quantile(v["itl"], itl_weights.get(name, []), 0.95)),
            "tokens_per_step": _round(per_step.get(name)),
        }
        for name, v in sorted(variants.items())
    ]
    backends = []
    state = gw.live.snapshot()
    policy = gw.policy.current
    for name, spec in policy.document.backends.items():
        b = state.backends.get(name)
        window = monitor.windows.get(name) if monitor is not None else None
        decode = window.rate("generation_tokens", 15.0) if window else None
        spec_desc = None
        if spec.speculative is not None:
            s = spec.speculative
            spec_desc = (
                f"{s.method} k={s.num_speculative_tokens} {s.draft_sample_method}/"
                f"{s.rejection_sample_method}"
            )
        guard = gw.live.guards.get(name)
        backends.append(
            {
                "name": name,
                "task": spec.task,
                "speculative": spec_desc,
                "health": b.health if b else "unknown",
                "in_flight": b.in_flight if b else 0,
                "queued": gw.admission.queued(name),
                "running": b.running if b else None,
                "waiting": b.waiting if b else None,
                "kv_usage": b.kv_usage if b else None,
                "decode_tokens_per_s": None if decode is None else round(decode, 1),
                # The engine's counters over the guards' window, by the same definition as per
                # request (proxy/backends/health.py); the variants' rows pool the requests'.
                "acceptance": _round(b.acceptance if b else None),
                "guard_tripped": bool(guard and guard.tripped),
                "per_position": [round(x, 3) for x in window.per_position(60.0)] if window else [],
            }
        )
    history = store.history()[-8:] if store is not None else []
    repairs = [
        {"backend": a.backend, "time": a.started, "result": a.result, "returncode": a.returncode}
        for a in (monitor.repairer.history if monitor is not None else [])
    ][-10:]
    return {
        "time": now_wall,
        "policy": {"version": policy.version, "history": history},
        "in_flight": in_flight,
        "recent": [_record_row(r) for r in reversed(recent[-25:])],
        "variants": variant_rows,
        "agents": _agent_rows(gw),
        "timeline": {
            "bucket_s": gw.timeline.bucket_s,
            "variants": gw.timeline.series("variants", gw.timeline.variant_names()),
        },
        "backends": backends,
        "admission": residency_rows(gw),  # session-aware admission, per engine
        "repairs": repairs,
        "events": gw.events.rows()[::-1],  # newest first; bounded (proxy/observe/events.py)
    }


def encoded(snap: dict[str, Any], limit: int) -> bytes:
    """The snapshot as JSON within `limit` bytes: a huge policy (its history of changes) or
    thousands of streams once sent each viewer 14.5 MB a second. Lists are cut to what the page
    shows, then halved until the snapshot fits, and `truncated` says so."""
    data = orjson.dumps(snap)
    if len(data) <= limit:
        return data
    policy = snap["policy"]
    snap = {
        **snap,
        "truncated": True,
        **{k: snap.get(k, [])[:_SHOWN] for k in _ROWS},
        "policy": {
            **policy,
            "history": [{**h, "changes": h.get("changes", [])[:10]} for h in policy["history"]],
        },
    }
    data = orjson.dumps(snap)
    while len(data) > limit:
        history = snap["policy"]["history"]
        if not history and not any(snap[k] for k in _ROWS):  # one huge value: the bare facts
            return orjson.dumps(
                {
                    "time": snap["time"],
                    "truncated": True,
                    "policy": {"version": policy["version"], "history": []},
                    **{k: [] for k in _ROWS},
                }
            )
        for k in _ROWS:
            snap[k] = snap[k][: len(snap[k]) // 2]
        snap["policy"]["history"] = history[(len(history) + 1) // 2 :]  # the latest kept
        data = orjson.dumps(snap)
    return data


def _static(name: str) -> bytes:
    return resources.files("proxy.admin").joinpath("static", name).read_bytes()


def dashboard_routes(
    gw: Gateway, monitor: HealthMonitor | None, store: PolicyStore | None
) -> list[BaseRoute]:
    limit = gw.settings.max_dashboard_bytes

    async def page(request: Request) -> Response:
        if "token" in request.query_params:
            # Refused, not used: a URL is kept in browser history and proxy logs.
            return login_form("a token in the URL is refused: log in with this form", 400)
        try:
            viewer(request)
        except Denied as exc:
            return refused(exc)
        return Response(
            _static("dashboard.html"), media_type="text/html", headers={"cache-control": "no-store"}
        )

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in {"dashboard.js", "charts.js", "dashboard.css"}:
            return Response(status_code=404)
        media = "text/javascript" if name.endswith(".js") else "text/css"
        return Response(_static(name), media_type=media)

    async def snap(request: Request) -> Response:
        try:
            viewer(request)
        except Denied as exc:
            return exc.response
        return Response(encoded(snapshot(gw, monitor, store), limit), media_type="application/json")

    async def events(request: Request) -> Response:
        try:
            viewer(request)
        except Denied as exc:
            return exc.response

        async def stream() -> AsyncIterator[bytes]:
            while True:
                yield b"data: " + encoded(snapshot(gw, monitor, store), limit) + b"\n\n"
                await asyncio.sleep(1.0)

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"cache-control": "no-cache"}
        )

    return [
        Route("/dashboard", page),
        Route("/dashboard/static/{name}", asset),
        Route("/dashboard/snapshot", snap),
        Route("/dashboard/events", events),
        *login_routes(),
    ]
