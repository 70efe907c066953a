"""The admin surface's view of session-aware admission (policies/admission.py): the explain's
verdict for a turn, and the dashboard's rows per engine."""

from __future__ import annotations

import time
from typing import Any

import orjson

from policies.admission import expected_wait_s, held_tokens
from policies.admission_explain import body_tokens, residency_from_json, turn_verdict
from policies.compiled import CompiledPolicy
from policies.types import Decision, RequestView
from proxy.admin.models import AdmissionOut
from proxy.gateway import Gateway
from proxy.relay.hold import capacity


def admission_out(
    gw: Gateway,
    residency: dict[str, Any] | None,
    view: RequestView,
    decision: Decision,
    policy: CompiledPolicy,
    body: dict[str, Any],
) -> AdmissionOut | None:
    """The turn's verdict on the decided engine; ValueError/TypeError on a bad residency."""
    name = decision.backend
    spec = policy.document.admission.sessions
    if name is None or (residency is None and not spec.enabled):
        return None
    if residency is not None:
        engine, kv = residency_from_json(residency, view.now)
        source = "given"
    else:
        engine = gw.residency.snapshot(name, view.now, spec.place_kept_s)
        kv, source = capacity(gw, policy, name).kv_tokens, "live"
    tokens = body_tokens(len(orjson.dumps(body)))
    verdict, _ = turn_verdict(view, name, policy, engine, kv, tokens)
    return AdmissionOut(
        backend=name,
        admit=verdict.admit,
        reason=verdict.reason,
        detail=verdict.detail,
        ahead=verdict.ahead,
        expected_wait_s=expected_wait_s(verdict, spec),
        source=source,
    )


def residency_rows(gw: Gateway) -> list[dict[str, Any]]:
    """Per engine: resident sessions and their tokens, KV tokens, turns waiting and the longest
    wait now, turns held so far, timed out, the longest wait (the dashboard's admission table)."""
    policy = gw.policy.current
    spec = policy.document.admission.sessions
    now = time.perf_counter()
    rows = []
    backends = policy.document.backends
    names = set(gw.residency.names())
    if spec.enabled:
        names |= {n for n, b in backends.items() if b.task == "generate"}
    for name in sorted(names):
        if name not in backends:
            continue
        st = gw.residency.engine(name)
        waits = [now - p.since for p in st.waiting.values() if p.holders > 0]
        live = [  # a residency idle past idle_s has ended, whether a decision saw it yet or not
            (k, r)
            for k, r in st.residents.items()
            if r.idle_since is None or now - r.idle_since < spec.idle_s
        ]
        prefixes = (gw.residency.prefix_tokens(name, k, r) for k, r in live)  # measured or not
        rows.append(
            {
                "backend": name,
                "enabled": spec.enabled,
                "resident": len(live),
                "resident_tokens": held_tokens(prefixes, st.shared_tokens),
                "kv_tokens": capacity(gw, policy, name).kv_tokens,
                "waiting": len(waits),
                "longest_wait_s": round(max(waits), 1) if waits else 0.0,
                "held": st.held,
                "timeouts": st.timeouts,
                "longest_ever_s": round(st.longest_s, 1),
            }
        )
    return rows
