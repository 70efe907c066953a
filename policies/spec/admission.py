"""The document's `admission:` section: the concurrency queue's timeout, and session-aware
admission (policies/admission.py is the rule, proxy/backends/residency.py its state)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from policies.spec.base import StrictModel


class SessionAdmissionSpec(StrictModel):
    """Which sessions' prefixes an engine's KV cache keeps: while the resident sessions'
    prefixes (a shared system-prompt prefix counted once) plus `max_num_seqs` x `turn_tokens`
    fit in `fit_fraction` of the engine's KV tokens, nothing waits; beyond that, a turn of a
    session that is not resident waits, first come first served (docs/sessions.md)."""

    enabled: bool = False
    # A waiting session's wait, once this long, ends a resident session's residency at that
    # session's next turn boundary. None: unlimited (residency ends only by idleness or
    # compaction).
    max_wait_s: Annotated[float, Field(gt=0)] | None = 600.0
    idle_s: Annotated[float, Field(gt=0)] = 60.0  # residency ends after this long idle
    fit_fraction: Annotated[float, Field(gt=0, le=1)] = 0.9  # of the engine's KV tokens
    # The tokens one turn adds (a tool result and an answer): max_num_seqs x this is kept free.
    turn_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = 4096
    # The system-prompt prefix sessions share (counted once); None: learned from the engine
    # (the cached tokens of a session's first turn there).
    shared_prefix_tokens: Annotated[int, Field(ge=0)] | None = None
    # A waiting session's place is kept this long after its request left (timed out, client
    # gone): the client's retry takes the same place.
    place_kept_s: Annotated[float, Field(gt=0)] = 120.0
    # A held stream (pinged meanwhile) waits at most this long, then gets an error event.
    stream_wait_s: Annotated[float, Field(gt=0)] = 1800.0


class AdmissionSpec(StrictModel):
    queue_timeout_s: Annotated[float, Field(gt=0)] = 30.0  # a held non-streaming request's wait
    sessions: SessionAdmissionSpec = SessionAdmissionSpec()
