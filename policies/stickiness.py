"""Whether a session leaves the engine that holds its prefix for the one the rules chose. Pure.

Moving throws the prefix cache away: the new engine prefills the whole conversation again
(100 K tokens at ~2,000 tokens/s is ~50 s), so a move must pay for itself within the session's
expected remaining turns:

    remaining = max(1, mean turns per session - turns so far)   (policy default_turns when the
                                                                table has seen too few sessions)
    gain_s    = remaining * out tokens per turn * (1 / held decode rate - 1 / new decode rate)
                + the turn's expected wait on the held engine (session-aware admission,
                policies/admission.py; 0 when it is admitted there)
    cost_s    = prefix tokens / new engine's prefill rate
    move when gain_s > cost_s

A backend without `decode_tokens_per_s` predicts no gain: its sessions stay until it cannot
serve (down, starting, tripped by its acceptance guard), and then the rules place them again.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.spec.backends import BackendSpec
from policies.types import SessionView


@dataclass(frozen=True, slots=True)
class MoveCost:
    held: str
    to: str
    remaining_turns: float
    out_per_turn: float
    gain_s: float
    prefix_tokens: int
    prefill_tokens_per_s: float
    cost_s: float
    wait_s: float = 0.0

    @property
    def pays(self) -> bool:
        return self.gain_s > self.cost_s

    def explain(self) -> str:
        verdict = ">" if self.pays else "<="
        wait = f" (with {self.wait_s:.0f} s of wait on {self.held})" if self.wait_s else ""
        return (
            f"{self.held} -> {self.to}: gain {self.remaining_turns:g} turns x "
            f"{self.out_per_turn:.0f} tokens{wait} = {self.gain_s:.2f} s {verdict} re-prefill "
            f"{self.prefix_tokens} tokens / {self.prefill_tokens_per_s:g} tokens/s = "
            f"{self.cost_s:.2f} s"
        )


def move_cost(
    session: SessionView,
    held: str,
    held_spec: BackendSpec,
    to: str,
    to_spec: BackendSpec,
    default_turns: float,
    wait_s: float = 0.0,
) -> MoveCost:
    mean = default_turns if session.mean_turns is None else session.mean_turns
    remaining = max(1.0, mean - session.turns)
    old_rate, new_rate = held_spec.decode_tokens_per_s, to_spec.decode_tokens_per_s
    per_token = 0.0 if old_rate is None or new_rate is None else 1.0 / old_rate - 1.0 / new_rate
    gain = remaining * session.out_tokens_per_turn * per_token + wait_s
    cost = session.prefix_tokens / to_spec.prefill_tokens_per_s
    return MoveCost(
        held,
        to,
        remaining,
        session.out_tokens_per_turn,
        gain,
        session.prefix_tokens,
        to_spec.prefill_tokens_per_s,
        cost,
        wait_s,
    )
