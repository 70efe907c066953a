"""The document's `fairness:` section: the vLLM `priority` of admitted sessions' requests on
priority-scheduling engines (policies/fairness.py computes it)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from pydantic import Field, field_validator

from policies.spec.base import StrictModel

# Levels within one client priority: vLLM gets client priority x LEVELS + level (lower first).
LEVELS: Final = 8
MAX_BOUNDARIES: Final = 3  # at most 4 levels of attained service
MAX_WINDOW_S: Final = 3600.0  # the session table keeps this much of each session's service
FairClass = Literal["subagent", "compaction", "auxiliary"]


class FairnessSpec(StrictModel):
    """Among admitted sessions, the client's priority first, then the session's attained
    service (tokens prefilled and decoded for it in the last `window_s`: prompt minus cached,
    plus completion), so a short session is not stuck behind long ones. Subagents, compaction
    and auxiliary requests (policies/agent_signals.py) have a level of their own.

    Off unless `enabled`; it acts only on backends with `priority_scheduling: true`, where the
    operator already asked vLLM to order by `priority`; docs/sessions.md ("Fairness") has the
    measurement (turn times of short and long sessions, preemptions, on and off)."""

    enabled: bool = False
    window_s: Annotated[float, Field(gt=0, le=MAX_WINDOW_S)] = 600.0
    # Attained tokens at which a session moves to the next level: level 1 below the first,
    # then 2, 3, 4. Ascending, at most 3 (4 levels).
    boundaries: Annotated[list[Annotated[int, Field(gt=0)]], Field(max_length=MAX_BOUNDARIES)] = [
        16_384,
        65_536,
        262_144,
    ]
    # A class's own level (0..7). Compaction and auxiliary calls: level 1, as a fresh session
    # (the agent waits on them; a client labelling every request so gains nothing a new session
    # would not). Subagents: 4, with the heaviest main sessions (they never rise by the label).
    # Level 0 is for an operator who trusts its clients' headers.
    classes: dict[FairClass, Annotated[int, Field(ge=0, lt=LEVELS)]] = {
        "compaction": 1,
        "auxiliary": 1,
        "subagent": 4,
    }

    @field_validator("boundaries")
    @classmethod
    def _ascending(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in zip(value, value[1:], strict=False)):
            raise ValueError("boundaries must be strictly ascending")
        return value
