"""One run of the sessions sweep, and the figures of its measured window (pure but for `run_one`).

A run is `specrouter replay`'s driver against a freshly started configuration, with the source
documents' context sizes, for `warmup + window` simulated seconds. The window is
[warmup, warmup + window) in simulated (unscaled) seconds:
- turns per hour: the turns that *ended* in the window, per simulated hour of it;
- turn time, TTFT and the longest wait are over the turns that *started* in the window, those
  still unfinished at its end included with their whole time (the driver lets every turn in
  flight at the deadline finish, and starts none after it): a turn held for ten minutes counts
  as such, not as missing; `unfinished` counts them;
- the longest wait is the longest time a turn waited for its first token (its TTFT; a turn
  that failed before one, its whole time): it is what a held turn costs its agent;
- prefix-cache hits and prefilled tokens per turn come from the engines' own counters between
  the end of the warm-up and the end of the run, over the turns that started after the warm-up.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from loadtests.replay.report import dist
from loadtests.replay.workload import WorkloadParams

# The source documents' context sizes (docs/sessions-sweep.md): sessions start from a 70K context (a
# 20K shared system prompt and tools, then 50K of their own), compact at 131,072 or 40 turns.
INITIAL_CONTEXT, MAX_CONTEXT, TURNS = 50000, 131072, 40


def window_figures(
    turns: Sequence[Mapping[str, Any]], start_s: float, end_s: float
) -> dict[str, Any]:
    """The window's figures from the replay's per-turn records (unscaled seconds)."""
    ok = [t for t in turns if t["error"] is None]
    resent = [t for t in turns if start_s <= t["start_s"] < end_s and t.get("resends")]
    ended = [t for t in ok if start_s <= t["start_s"] + t["turn_s"] < end_s]
    started = [t for t in turns if start_s <= t["start_s"] < end_s]
    unfinished = [t for t in started if t["start_s"] + t["turn_s"] >= end_s]
    waits = [t["turn_s"] if t["ttft_s"] is None else t["ttft_s"] for t in started]
    hours = (end_s - start_s) / 3600.0
    turn = dist(t["turn_s"] for t in started if t["error"] is None)
    ttft = dist(t["ttft_s"] for t in started)
    return {
        "turns_per_hour": len(ended) / hours if hours > 0 else None,
        "turns_ended": len(ended),
        "turns_started": len(started),
        "unfinished": len(unfinished),
        "errors": sum(1 for t in started if t["error"] is not None),
        "turn_p50": turn.get("p50"),
        "turn_p95": turn.get("p95"),
        "turn_max": turn.get("max"),
        "ttft_p50": ttft.get("p50"),
        "ttft_p95": ttft.get("p95"),
        "longest_wait": max(waits, default=None),
        # Impatient agents: turns sent more than once, the resends, the watchdogs that fired,
        # and what the resent turns' last sends prefilled (their prompt less what was cached).
        "turns_resent": len(resent),
        "resends": sum(t.get("resends", 0) for t in resent),
        "watchdog_fires": sum(t.get("watchdog_fires", 0) for t in started),
        "resend_prefill_tokens": sum(
            t["prompt_tokens"] - (t["cached_tokens"] or 0)
            for t in resent
            if t["error"] is None and t["cached_tokens"] is not None
        ),
    }


def figures(report: Mapping[str, Any], start_s: float, end_s: float) -> dict[str, Any]:
    """What the sweep records of one replay report."""
    o = report["overall"]
    return {
        **window_figures(report["turns"], start_s, end_s),
        "prefix_hit_rate": o.get("prefix_hit_rate"),
        "prefilled_per_turn": o.get("prefilled_per_turn"),
        "preemptions": o.get("preemptions"),
        "cpu": report["cpu_core_share"],
        "cpu_max": max(report["cpu_core_share"].values(), default=0.0),
        "warnings": report["warnings"],
        "error_samples": report["error_samples"],
    }


def admission_figures(metrics_text: str) -> dict[str, Any]:
    """What session-aware admission did over a whole run (warm-up included), from the gateway's
    own counters (proxy/observe/admission_metrics.py): the turns it decided, those it held, and
    how the holds ended. Where everything fits, `held` must be 0: the rule did nothing."""
    decided: dict[str, float] = {}
    reasons: dict[str, float] = {}  # of the held turns
    outcomes: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "specrouter_session_admission_total":
                verdict = sample.labels["verdict"]
                decided[verdict] = decided.get(verdict, 0.0) + sample.value
                if verdict == "wait":
                    why = sample.labels["reason"]
                    reasons[why] = reasons.get(why, 0.0) + sample.value
            elif sample.name == "specrouter_session_waits_total":
                outcome = sample.labels["outcome"]
                outcomes[outcome] = outcomes.get(outcome, 0.0) + sample.value
    return {
        "decided": int(sum(decided.values())),
        "held": int(decided.get("wait", 0.0)),
        "held_by_reason": {k: int(v) for k, v in sorted(reasons.items()) if v},
        "wait_outcomes": {k: int(v) for k, v in sorted(outcomes.items()) if v},
    }


def params(agents: int, temperature: str, seed: int, *, mix: bool = False) -> WorkloadParams:
    """`mix`: chat (aider's clocks) and Responses (Codex's) 3 : 1, for the impatient agents."""
    temp = None if temperature == "unset" else float(temperature)
    return WorkloadParams(
        api_mix={"chat": 3.0, "responses": 1.0} if mix else {"chat": 1.0},
        agents=agents,
        temperatures=(temp,),
        seed=seed,
        initial_context=INITIAL_CONTEXT,
        max_context=MAX_CONTEXT,
        turns=TURNS,
    )


def run_one(
    config_name: str,
    agents: int,
    temperature: str,
    seed: int,
    *,
    time_scale: float,
    window_s: float,
    warmup_s: float,
) -> dict[str, Any]:
    """Starts the configuration, runs the replay, stops it; the figures and the KV tokens."""
    from loadtests.bench.sweep.launch import started
    from loadtests.replay.cli import replay

    from .configs import BY_NAME, IMPATIENT

    config = BY_NAME[config_name]
    wall = (warmup_s + window_s) * time_scale
    impatient = config_name in IMPATIENT
    args = argparse.Namespace(
        duration=wall, progress_s=60.0, warmup=warmup_s * time_scale, watchdogs=impatient
    )
    with started(config, time_scale=time_scale, seed=seed) as (target, kv, gateway):
        work = params(agents, temperature, seed, mix=impatient)
        report = replay(args, work, target, time_scale)
        held = None if gateway is None else admission_figures(gateway.metrics())
    return {
        **figures(report, warmup_s, warmup_s + window_s),
        "kv_tokens": kv,
        "wall_s": report["wall_s"],
        **({} if held is None else {"admission": held, "held": held["held"]}),
    }
