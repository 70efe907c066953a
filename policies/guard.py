"""The acceptance guard's state machine: `advance(prev, acceptance, now, rule) -> GuardState`. Pure.

The gateway calls `advance` for each guarded backend (`CompiledPolicy.guards`) whenever it has a
new windowed acceptance reading (accepted tokens per target step), and puts the result in
`LiveState.guards`; the engine only reads `GuardState.tripped`.

    ok --(below `below` for `for_s`)--> tripped --(`probe_after_s` without recovery)--> on trial
     ^                                     |                                              |
     +---(at or above `recover_above` for `recover_for_s`)---------------------------------+
                                           ^                                              |
                                           +-----------(any reading below `below`)---------+

Hysteresis: tripping needs a reading below `below`, recovery one at or above `recover_above`
(>= `below`), each held for its own duration; readings in between reset both clocks, so a
variant hovering at the threshold does not flap. The durations are inclusive: a condition held
for exactly `for_s` seconds trips.

Why a trial: once tripped, the variant gets no traffic, so its engine's spec-decode counters stop
moving and no reading can show recovery. After `probe_after_s` traffic returns on trial; a low
reading (the window then holds only trial traffic, given `probe_after_s` >= the window) trips it
again at once, a high one held for `recover_for_s` ends the trial. `acceptance=None` (no reading:
no drafts in the window) changes nothing but the trial clock.
"""

from __future__ import annotations

from policies.spec.rules import GuardRule
from policies.types import GuardState

OK = GuardState()


def advance(prev: GuardState, acceptance: float | None, now: float, rule: GuardRule) -> GuardState:
    if prev.tripped:
        return _advance_tripped(prev, acceptance, now, rule)
    if acceptance is None:
        return prev
    if acceptance < rule.below:
        if prev.probing:
            return GuardState(tripped=True, low_since=now, tripped_at=now)  # the trial failed
        low_since = now if prev.low_since is None else prev.low_since
        if now - low_since >= rule.for_s:
            return GuardState(tripped=True, low_since=low_since, tripped_at=now)
        return GuardState(low_since=low_since)
    if not prev.probing:
        return OK  # at or above the trip threshold: the low clock restarts
    # On trial: recovery needs the upper threshold, held.
    if acceptance < rule.recover_threshold:
        return GuardState(probing=True)
    high_since = now if prev.high_since is None else prev.high_since
    if now - high_since >= rule.recover_duration_s:
        return OK
    return GuardState(probing=True, high_since=high_since)


def _advance_tripped(
    prev: GuardState, acceptance: float | None, now: float, rule: GuardRule
) -> GuardState:
    # Readings can still arrive while tripped (requests in flight when it tripped, traffic from
    # outside the gateway, a pinned client): recovery on them needs no trial.
    high_since = prev.high_since
    if acceptance is not None:
        if acceptance >= rule.recover_threshold:
            high_since = now if high_since is None else high_since
            if now - high_since >= rule.recover_duration_s:
                return OK
        else:
            high_since = None
    tripped_at = now if prev.tripped_at is None else prev.tripped_at
    if rule.probe_after_s is not None and now - tripped_at >= rule.probe_after_s:
        return GuardState(probing=True, high_since=high_since)
    return GuardState(
        tripped=True, low_since=prev.low_since, high_since=high_since, tripped_at=tripped_at
    )
