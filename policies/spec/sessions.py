"""The document's `sessions:` section: stickiness of a session to the engine holding its prefix."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from policies.spec.base import StrictModel


class SessionsSpec(StrictModel):
    """A session stays on its engine unless that engine cannot serve, or a move pays for itself:
    the decode time saved over the expected remaining turns must exceed the time to re-prefill
    the session's uncached prefix on the new engine (policies/stickiness.py)."""

    sticky: bool = True
    default_turns: Annotated[float, Field(gt=0)] = 10.0  # expected turns before any is seen
    table_size: Annotated[int, Field(ge=1, le=1_000_000)] = 10_000  # least recent dropped
    idle_s: Annotated[float, Field(gt=0)] = 1800.0  # a session this idle is placed anew
    # vLLM priority for subagents' requests on priority-scheduling engines (lower runs first);
    # None: the client's own priority. Never ahead of the client's own: a client names its
    # requests a subagent's by a header, so this can only lower their priority.
    subagent_priority: int | None = None
