"""The replay's figures: per agent and overall turn time, TTFT and decode rate (p50/p95, run
counts, spread), prefix-cache hit rate and preemptions; as text, JSON and a PNG.

Pure but for the PNG and the engines' /metrics: the statistics are tested on tables.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from proxy.observe.stats import quantile
from proxy.vllm_wire import Family

from .driver import TurnResult

ENGINE_COUNTERS = {
    Family.PREFIX_CACHE_QUERIES: "prefix_queries",
    Family.PREFIX_CACHE_HITS: "prefix_hits",
    Family.PREEMPTIONS: "preemptions",
}
CPU_WARN = 0.80  # of one core


def engine_counters(text: str) -> dict[str, float]:
    """The prefix-cache and preemption counters of one engine's /metrics."""
    out = dict.fromkeys(ENGINE_COUNTERS.values(), 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in ENGINE_COUNTERS and not sample.name.endswith("_created"):
                out[ENGINE_COUNTERS[name]] += sample.value
    return out


def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def dist(values: Iterable[float | None]) -> dict[str, Any]:
    xs = sorted(float(v) for v in values if v is not None)
    if not xs:
        return {"n": 0}
    return {
        "n": len(xs),
        "p50": quantile(xs, 0.5),
        "p95": quantile(xs, 0.95),
        "min": xs[0],
        "max": xs[-1],
    }


def summarize(turns: Sequence[TurnResult]) -> dict[str, Any]:
    ok = [t for t in turns if t.error is None]
    prompt = sum(t.prompt_tokens for t in ok if t.cached_tokens is not None)
    cached = sum(t.cached_tokens or 0 for t in ok if t.cached_tokens is not None)
    return {
        "turns": len(ok),
        "errors": len(turns) - len(ok),
        "subagent_turns": sum(1 for t in ok if t.subagent),
        "turns_resent": sum(1 for t in turns if t.resends),
        "resends": sum(t.resends for t in turns),
        "turn_s": dist(t.turn_s for t in ok),
        "ttft_s": dist(t.ttft_s for t in ok),
        "decode_tok_s": dist(t.decode_tok_s for t in ok),
        "context_tokens": dist(t.context_tokens for t in ok),
        "generated_tokens": sum(t.completion_tokens for t in ok),
        # Only where the API's usage reports cached tokens (Responses, Messages; chat when the
        # engine fills prompt_tokens_details); the engines' counters give the overall rate.
        "usage_hit_rate": cached / prompt if prompt else None,
    }


def build(
    turns: Sequence[TurnResult],
    *,
    params: dict[str, Any],
    time_scale: float,
    wall_s: float,
    engines: dict[str, float] | None,
    cpu: dict[str, float],
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """`engines` are the counters over the measured window; `warmup_s` (unscaled) is where it
    starts: turns started before it are kept in "turns" but left out of every figure."""
    measured = [t for t in turns if t.start_s >= warmup_s]
    agents = sorted({t.agent for t in measured})
    overall = summarize(measured)
    if engines is not None:
        q = engines.get("prefix_queries", 0.0)
        overall["prefix_hit_rate"] = engines.get("prefix_hits", 0.0) / q if q else None
        overall["preemptions"] = engines.get("preemptions", 0.0)
        # What each turn had to prefill (prompt tokens the cache did not serve): the facts'
        # ~4,000 is ~2 s at ~2,000 tokens/s.
        n = overall["turns"]
        overall["prefilled_per_turn"] = (q - engines.get("prefix_hits", 0.0)) / n if n else None
    warnings = [
        f"{who} used {share:.0%} of a core (> {CPU_WARN:.0%}): its figures are this "
        "machine's, not the GB10's"
        for who, share in cpu.items()
        if share > CPU_WARN
    ]
    errors = sorted({t.error for t in turns if t.error})[:5]
    window = (
        f"measured after a {warmup_s:g} s warm-up (turns that started later; the engines' "
        "counters from then on)"
        if warmup_s > 0
        else "measured over the whole run, cold caches included"
    )
    return {
        "time_scale": time_scale,
        "wall_s": wall_s,
        "warmup_s": warmup_s,
        "window": window,
        "note": "every duration is unscaled (wall seconds / time scale)",
        "params": params,
        "overall": overall,
        "per_agent": {str(a): summarize([t for t in measured if t.agent == a]) for a in agents},
        "cpu_core_share": cpu,
        "warnings": warnings,
        "error_samples": errors,
        "turns": [asdict(t) for t in turns],
    }


def _fmt(d: dict[str, Any], digits: int = 1) -> str:
    if not d.get("n"):
        return "-"
    return (
        f"{d['p50']:.{digits}f}/{d['p95']:.{digits}f} "
        f"[{d['min']:.{digits}f}-{d['max']:.{digits}f}] n={d['n']}"
    )


def text(report: dict[str, Any]) -> str:
    lines = [
        f"replay at time scale {report['time_scale']:g} ({report['wall_s']:.0f} s wall); "
        "figures unscaled, p50/p95 [min-max] n=turns",
        report["window"],
    ]
    head = f"{'agent':<8} {'turns':>5} {'turn s':>30} {'TTFT s':>30} {'decode tok/s':>30}"
    lines.append(head)
    rows = [*report["per_agent"].items(), ("all", report["overall"])]
    for name, s in rows:
        lines.append(
            f"{name:<8} {s['turns']:>5} {_fmt(s['turn_s']):>30} "
            f"{_fmt(s['ttft_s'], 2):>30} {_fmt(s['decode_tok_s']):>30}"
        )
    o = report["overall"]
    hit = o.get("prefix_hit_rate")
    lines.append(
        f"prefix-cache hit rate {'-' if hit is None else f'{hit:.1%}'}, prefilled per turn "
        f"{o.get('prefilled_per_turn') or 0:.0f} tokens, preemptions "
        f"{o.get('preemptions', '-')}, errors {o['errors']}, generated "
        f"{o['generated_tokens']} tokens"
    )
    kv = report.get("kv")
    if kv:
        tokens = ", ".join(f"{name} {n:,}" for name, n in kv["tokens"].items())
        lines.append(f"simulated KV budget {kv['budget']}: {tokens} tokens")
    lines += [f"WARNING: {w}" for w in report["warnings"]]
    lines += [f"error: {e}" for e in report["error_samples"]]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    turns = [t for t in report["turns"] if t["error"] is None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    agents = sorted({t["agent"] for t in turns})
    data = [[t["turn_s"] for t in turns if t["agent"] == a] for a in agents]
    if data:
        ax1.boxplot(data, tick_labels=[str(a) for a in agents])
    ax1.set(xlabel="agent", ylabel="turn time, s (unscaled)", title="turn time per agent")
    ctx = [t["context_tokens"] / 1000 for t in turns if t["ttft_s"] is not None]
    ttft = [t["ttft_s"] for t in turns if t["ttft_s"] is not None]
    ax2.scatter(ctx, ttft, s=8)
    ax2.set(xlabel="context, K tokens", ylabel="TTFT, s (unscaled)", title="TTFT vs context")
    fig.suptitle(f"specrouter replay: {len(agents)} agents, time scale {report['time_scale']:g}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
