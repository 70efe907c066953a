"""Fairness among admitted sessions: a request's vLLM `priority`, with the reason. Pure.

vLLM (`--scheduling-policy priority`) serves its waiting queue by (`priority`, arrival), lower
first, and under memory pressure preempts the running request with the largest (`priority`,
arrival) (vllm/v1/core/sched/scheduler.py, request_queue.py). The gateway sends

    priority = client priority x LEVELS + level

so the client's own priority comes first, whatever the level (0..LEVELS-1) says:

- compaction, auxiliary, subagent requests (policies/agent_signals.py's class, or a subagent's
  session headers): the class's own level (`fairness.classes`); a subagent is never placed
  ahead of the level its own attained service gives;
- any other request: its session's attained service, the tokens served for it within
  `fairness.window_s` (prompt minus cached, plus completion; counted by the gateway,
  proxy/backends/attained.py), as level 1 below the first boundary, 2 below the second, ...
  A request without a session counts as a fresh one (level 1).

Level 0 is ahead of every session's; no default gives it (see policies/spec/fairness.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from policies.spec.fairness import LEVELS, FairnessSpec
from policies.types import RequestView

FIRST_ATTAINED_LEVEL: Final = 1
CLASSES: Final = frozenset({"subagent", "compaction", "auxiliary"})


@dataclass(frozen=True, slots=True)
class Fair:
    priority: int  # what vLLM gets
    level: int  # within the client's priority
    by: str  # "session" (no session), "attained", a class name, "subagent-attained"
    client_priority: int
    attained_tokens: int | None

    def why(self, spec: FairnessSpec) -> str:
        """For explain: what set the level, and the arithmetic."""
        if self.by == "session":
            what = "no session: as a fresh one"
        elif self.by in ("attained", "subagent-attained"):
            what = (
                f"attained {self.attained_tokens or 0:,} tokens in {spec.window_s:g} s"
                f"{_range(spec, self.level)}"
            )
            if self.by == "subagent-attained":
                what = f"subagent, {what}: not ahead of its attained level"
        else:
            what = f"{self.by}: its own level"
        return (
            f"{what}; level {self.level} + client priority {self.client_priority} x {LEVELS}"
            f" = {self.priority}"
        )


def attained_level(spec: FairnessSpec, tokens: int) -> int:
    """1 + the number of boundaries `tokens` reached."""
    return FIRST_ATTAINED_LEVEL + sum(1 for b in spec.boundaries if tokens >= b)


def fair_priority(
    spec: FairnessSpec,
    client_priority: int,
    request_class: str,
    subagent: bool,
    attained_tokens: int | None,
) -> Fair:
    """The priority of one request on a priority-scheduling engine (see the module docstring)."""
    if attained_tokens is None:
        level, by = FIRST_ATTAINED_LEVEL, "session"
    else:
        level, by = attained_level(spec, attained_tokens), "attained"
    cls = "subagent" if subagent and request_class in ("", "main", "other") else request_class
    own = spec.classes.get(cls) if cls in CLASSES else None  # type: ignore[call-overload]
    if own is not None:
        if cls == "subagent" and level > own:
            by = "subagent-attained"
        else:
            level, by = own, cls
    level = min(level, LEVELS - 1)
    return Fair(client_priority * LEVELS + level, level, by, client_priority, attained_tokens)


def _range(spec: FairnessSpec, level: int) -> str:
    i = level - FIRST_ATTAINED_LEVEL
    low = spec.boundaries[i - 1] if i > 0 else None
    high = spec.boundaries[i] if i < len(spec.boundaries) else None
    if high is None and low is None:
        return ""
    if high is None:
        return f", >= {low:,}: level {level}"
    return f", < {high:,}: level {level}"


def request_priority(
    view: RequestView,
    client_priority: int | None,
    spec: FairnessSpec,
    subagent_priority: int | None,
    *,
    explain: bool = False,
) -> tuple[int | None, str]:
    """The `priority` for a priority-scheduling engine, and why (only with `explain`). With
    fairness off: the client's own (None without a client), a subagent's lowered to
    `sessions.subagent_priority` when set (never raised above the client's own)."""
    subagent = view.session is not None and view.session.subagent
    if not spec.enabled:
        own = client_priority
        if subagent and subagent_priority is not None:
            lowered = max(subagent_priority, own or 0)
            return lowered, explain and f"fairness off: subagent priority {lowered}" or ""
        return own, explain and f"fairness off: the client's priority {own}" or ""
    attained = view.session.attained_tokens if view.session is not None else None
    fair = fair_priority(spec, client_priority or 0, view.request_class, subagent, attained)
    why = fair.why(spec) if explain else ""
    if subagent and subagent_priority is not None and subagent_priority > fair.priority:
        why = explain and f"{why}; sessions.subagent_priority {subagent_priority}" or ""
        return subagent_priority, why
    return fair.priority, why
